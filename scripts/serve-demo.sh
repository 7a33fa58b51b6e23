#!/usr/bin/env bash
# Sets everything up and serves an embedded tiny Llama on the host mesh backend at
# http://127.0.0.1:8000 (OpenAI API). Needs no Tenstorrent hardware.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
VENV="$REPO_ROOT/.venv"
[ -x "$VENV/bin/python" ] || uv venv --quiet -p "$TT_PYTHON" "$VENV"
uv pip install --quiet -p "$VENV/bin/python" --overrides overrides.txt -r requirements/vllm-0.33.0.txt \
  -e packages/tt-sampling -e packages/tt-scheduler -e packages/tt-models-registry -e packages/tt-platform \
  -e packages/tt-host
MODEL_DIR="${TT_DEMO_MODEL_DIR:-$REPO_ROOT/artifacts/tiny-llama}"
"$VENV/bin/vllm-tt-tiny-model" --arch llama --out "$MODEL_DIR" --train-steps "${TT_DEMO_TRAIN_STEPS:-600}"
export TT_MESH_BACKEND=host
exec "$VENV/bin/vllm" serve "$MODEL_DIR" --served-model-name tiny-llama --host 127.0.0.1 --port "${PORT:-8000}" \
  --max-num-seqs 8 --max-model-len 1024 "$@"
