"""Platform detection: active where ttnn imports, and loud when an installed ttnn is broken."""

from __future__ import annotations

import logging
import sys

import pytest
from vllm_tt_platform import detect


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def records():
    handler = _Records()
    logger = logging.getLogger("vllm.vllm_tt_platform")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_active_where_ttnn_imports(records):
    assert detect() == "vllm_tt_platform.platform.TTPlatform"
    assert records == []


def test_a_broken_ttnn_declines_and_says_why(tmp_path, monkeypatch, records):
    broken = tmp_path / "ttnn"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise OSError("libtt_metal.so: cannot open shared object file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "ttnn" or m.startswith("ttnn.")]:
        monkeypatch.delitem(sys.modules, name)
    assert detect() is None
    assert len(records) == 1
    assert "ttnn is installed but `import ttnn` failed" in records[0]
    assert "libtt_metal.so: cannot open shared object file" in records[0]


def test_detection_imports_ttnn_without_its_config_dump_and_keeps_its_later_logs():
    """ttnn logs ``DEBUG ... Initial ttnn.CONFIG:`` and the whole config while it imports; every
    vLLM process printed it and it reads like an error (docs/troubleshooting.md)."""
    import subprocess

    code = ("import vllm_tt_platform as p; print(p.detect())\n"
            "import ttnn\n"
            "with ttnn.manage_config('enable_logging', False): pass\n")  # ttnn logs 'Set ttnn.CONFIG...'
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "vllm_tt_platform.platform.TTPlatform"
    assert "Initial ttnn.CONFIG" not in out.stderr and "Config{" not in out.stderr
    assert "Set ttnn.CONFIG.enable_logging" in out.stderr
