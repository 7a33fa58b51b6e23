#!/usr/bin/env bash
# The whole test suite on the newest supported vLLM (what CI runs). Extra args go to pytest.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
exec nox -s "tests(0.33)" -- "$@"
