"""Generated docs pages are in step with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_configuration_reference_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_troubleshooting_lists_every_error_type():
    from vllm_tt_platform import errors

    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    for name in ("TTConfigError", "TTUnsupportedFeatureError", "TTUnsupportedRequestError", "TTDeviceNotFoundError", "TraceNotCapturedError",
                 "MixedStepError", "BundleError"):
        assert name in page, name
    assert errors.TTConfigError.__name__ in page
