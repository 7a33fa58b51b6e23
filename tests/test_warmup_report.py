"""Warmup that reports: each capture is logged with its shape and time (modelled device time makes
it take as long as one run of the program), each runner pass and a summary with the total; a
shape met at run time that warmup did not capture is logged once with the shape."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice, TraceNotCapturedError
from vllm_tt_host.models.frame.shapes import TraceKey
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_platform.runner.warmup_report import WarmupReport


@contextlib.contextmanager
def log_lines(module: str) -> Iterator[list[str]]:
    """Messages of vLLM-style logger ``vllm.<module>`` (vLLM's loggers do not propagate)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger(f"vllm.{module}")
    handler = Collect(logging.INFO)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def device(time_spec: str | None = None) -> HostMeshDevice:
    options = HostDeviceOptions(device_time=parse_device_time(time_spec) if time_spec else None)
    return HostMeshDevice(MeshShape(1, 1), options=options)


def test_each_capture_is_logged_with_its_shape_and_takes_the_programs_modelled_time():
    mesh = device("50ms")
    try:
        with log_lines("vllm_tt_host.device") as lines:
            seconds = mesh.capture_trace(TraceKey.prefill(128), 0.05)
            mesh.capture_trace(TraceKey.decode(4, True))
        assert seconds >= 0.05
        assert len(lines) == 2
        assert "prefill[len=128,batch=1]" in lines[0] and " s" in lines[0]
        assert "decode[len=1,batch=4+sampling]" in lines[1]
        assert mesh.captured_traces == {TraceKey.prefill(128), TraceKey.decode(4, True)}
    finally:
        mesh.close()


def test_a_shape_warmup_did_not_capture_is_logged_once_with_the_shape():
    mesh = device()
    mesh.capture_trace(TraceKey.prefill(128))
    with log_lines("vllm_tt_host.device") as lines:
        for _ in range(3):
            with pytest.raises(TraceNotCapturedError):
                mesh.replay_trace(TraceKey.prefill(256))
        mesh.replay_trace(TraceKey.prefill(128))
    assert len(lines) == 1
    assert "prefill[len=256,batch=1]" in lines[0] and "captured: prefill[len=128,batch=1]" in lines[0]


def test_the_runner_report_logs_each_pass_and_a_summary_with_the_total():
    report = WarmupReport()
    with log_lines("vllm_tt_platform.runner.warmup_report") as lines:
        with report.timed("decode compile (4 rows x 8 blocks)"):
            pass
        with report.timed("decode trace capture (4 rows x 8 blocks)"):
            pass
        report.log_summary()
    assert [what for what, _ in report.passes] == ["decode compile (4 rows x 8 blocks)",
                                                   "decode trace capture (4 rows x 8 blocks)"]
    assert lines[0].startswith("TT warmup: decode compile (4 rows x 8 blocks) in ")
    assert lines[-1] == f"TT warmup done: 2 passes in {report.total_s:.2f} s"
