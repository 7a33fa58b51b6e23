"""``source scripts/env.sh`` is what the README tells a user to type in their own shell: it must
put the project's commands on PATH and leave the shell's options as they were (``set -e``
leaked into an interactive shell closes it on the first failing command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Prints the shell's option flags and pipefail/nounset before and after sourcing, then PATH.
PROBE = """
before="$- $(set -o | grep -E '^(pipefail|nounset|errexit)' | tr -s ' \t' ' ' | tr '\n' ' ')"
source "$ROOT/scripts/env.sh"
echo "rc=$?"
after="$- $(set -o | grep -E '^(pipefail|nounset|errexit)' | tr -s ' \t' ' ' | tr '\n' ' ')"
echo "before=$before"
echo "after=$after"
echo "PATH=$PATH"
source "$ROOT/scripts/env.sh"
echo "PATH2=$PATH"
"""


def _source() -> dict[str, str]:
    # A user's PATH before sourcing: none of the project's folders yet.
    env = {**os.environ, "ROOT": str(ROOT), "TT_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", PROBE], capture_output=True, text=True, env=env, timeout=120, check=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def test_sourcing_leaves_the_shell_options_as_they_were():
    seen = _source()
    assert seen["rc"] == "0"
    assert seen["before"] == seen["after"]
    assert "off" in seen["after"] and "e" not in seen["after"].split()[0]


def test_sourcing_puts_tools_first_and_the_product_venv_last_once():
    seen = _source()
    path = seen["PATH"].split(":")
    assert path[0] == str(ROOT / ".venv-tools" / "bin")
    assert path[-1] == str(ROOT / ".venv" / "bin")  # vllm, vllm-tt-models; never shadows the user's tools
    assert seen["PATH2"] == seen["PATH"]  # sourcing twice adds nothing


def test_a_missing_python_returns_an_error_and_keeps_the_shell():
    env = {"TT_PYTHON": "/nonexistent/python3.12", "PATH": "/usr/bin:/bin"}  # no pyenv, no 3.12 here
    probe = 'source "$ROOT/scripts/env.sh"; echo "rc=$? still-here"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60,
                         env={"ROOT": str(ROOT), "HOME": os.environ.get("HOME", "/"), **env})
    assert "rc=1 still-here" in out.stdout
    assert "Python 3.12 not found" in out.stderr and "TT_PYTHON" in out.stderr
