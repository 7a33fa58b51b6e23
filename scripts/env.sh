# Source it (`source scripts/env.sh`): finds Python 3.12, makes a tools venv with nox + uv and puts
# the project's commands on PATH: nox and uv first, then the demo's product venv (`.venv/bin`:
# `vllm`, `vllm-tt-models`, `vllm-tt-tiny-model`, once `bash scripts/serve-demo.sh` has made it) at
# the end, so it never shadows the user's own tools. The scripts that execute set their own
# `set -euo pipefail`; this file sets no shell options, so sourcing it leaves an interactive
# shell as it was (a failing command does not close it). On error it returns 1.
# ttnn ships cp310/cp312 wheels only and vLLM >= 0.32 needs >= 3.11, so 3.12 it is. Under pyenv,
# `python3.12` only resolves with PYENV_VERSION set, so we try that too.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export UV_PYTHON_DOWNLOADS=never

find_python312() {
  local candidate out version
  for candidate in "${TT_PYTHON:-}" python3.12; do
    [ -n "$candidate" ] || continue
    if out=$("$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12); print(sys.executable)' 2>/dev/null); then
      echo "$out"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    for version in ${PYENV_VERSION:-} $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -rV); do
      if out=$(PYENV_VERSION="$version" python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null); then
        echo "$out"; return 0
      fi
    done
  fi
  echo "error: Python 3.12 not found; install it (e.g. pyenv install 3.12) or set TT_PYTHON=/path/to/python3.12" >&2
  return 1
}

# Appends a folder to PATH unless it is already there (sourcing twice adds nothing).
path_append() { case ":$PATH:" in *":$1:"*) ;; *) PATH="$PATH:$1" ;; esac; }
path_prepend() { case ":$PATH:" in *":$1:"*) ;; *) PATH="$1:$PATH" ;; esac; }

TT_PYTHON="$(find_python312)" || return 1
export TT_PYTHON
TOOLS="$REPO_ROOT/.venv-tools"
if [ ! -x "$TOOLS/bin/nox" ] || [ ! -x "$TOOLS/bin/uv" ]; then
  echo "env.sh: creating the tools venv $TOOLS (nox, uv; ~75 MB, once)" >&2
  { "$TT_PYTHON" -m venv "$TOOLS" && "$TOOLS/bin/python" -m pip install --quiet "nox[uv]==2026.10.20" "uv==0.13.9"; } \
    || { echo "error: could not install nox and uv into $TOOLS (see pip's message above)" >&2; return 1; }
fi
path_prepend "$TOOLS/bin"
path_append "$REPO_ROOT/.venv/bin"
export PATH
unset -f find_python312 path_append path_prepend
