#!/usr/bin/env bash
# Sets everything up and serves an embedded tiny Llama on the host mesh backend at
# http://127.0.0.1:8000 (OpenAI API). Needs no Tenstorrent hardware. Each step says what it does;
# measured times and disk use are in the README. TT_DEMO_TRAIN_STEPS=N trains fewer (faster,
# less text-like) or more steps; TT_DEMO_MODEL_DIR=DIR writes the checkpoint elsewhere.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
VENV="$REPO_ROOT/.venv"
step() { echo "serve-demo [$1/3] $2" >&2; }

step 1 "installing vLLM 0.33 + torch and the five vllm-tt distributions into $VENV (~9 GB; uv links them from its cache, so a second run installs nothing)"
[ -x "$VENV/bin/python" ] || uv venv --quiet -p "$TT_PYTHON" "$VENV"
# uv's counts (resolved, built, installed N packages) without its line per package
uv pip install -p "$VENV/bin/python" --overrides overrides.txt -r requirements/vllm-0.33.0.txt \
  -e packages/tt-sampling -e packages/tt-scheduler -e packages/tt-models-registry -e packages/tt-platform \
  -e packages/tt-host 2>&1 | { grep -Ev '^ [-+~] ' || true; }

MODEL_DIR="${TT_DEMO_MODEL_DIR:-$REPO_ROOT/artifacts/tiny-llama}"
STEPS="${TT_DEMO_TRAIN_STEPS:-600}"
step 2 "tiny Llama checkpoint in $MODEL_DIR ($STEPS training steps after torch imports, once; a finished one is reused)"
"$VENV/bin/vllm-tt-tiny-model" --arch llama --out "$MODEL_DIR" --train-steps "$STEPS"

step 3 "vllm serve on http://127.0.0.1:${PORT:-8000} (imports torch and vLLM first; ready when /health answers and vLLM logs 'Application startup complete')"
export TT_MESH_BACKEND=host
exec "$VENV/bin/vllm" serve "$MODEL_DIR" --served-model-name tiny-llama --host 127.0.0.1 --port "${PORT:-8000}" \
  --max-num-seqs 8 --max-model-len 1024 "$@"
