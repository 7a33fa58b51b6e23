# Sourced by the other scripts: finds Python 3.12 and a tools venv with nox + uv.
# ttnn ships cp310/cp312 wheels only and vLLM >= 0.32 needs >= 3.11, so 3.12 it is. Under pyenv,
# `python3.12` only resolves with PYENV_VERSION set, so we try that too.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export UV_PYTHON_DOWNLOADS=never

find_python312() {
  local candidate
  for candidate in "${TT_PYTHON:-}" python3.12; do
    [ -n "$candidate" ] || continue
    if out=$("$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12); print(sys.executable)' 2>/dev/null); then
      echo "$out"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local version
    for version in ${PYENV_VERSION:-} $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -rV); do
      if out=$(PYENV_VERSION="$version" python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null); then
        echo "$out"; return 0
      fi
    done
  fi
  echo "error: Python 3.12 not found; install it (e.g. pyenv install 3.12) or set TT_PYTHON=/path/to/python3.12" >&2
  return 1
}

TT_PYTHON="$(find_python312)"
export TT_PYTHON
TOOLS="$REPO_ROOT/.venv-tools"
if [ ! -x "$TOOLS/bin/nox" ] || [ ! -x "$TOOLS/bin/uv" ]; then
  "$TT_PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet "nox[uv]==2026.10.20" "uv==0.13.9"
fi
export PATH="$TOOLS/bin:$PATH"
