"""TT metrics from the runner's steps to Prometheus series in an API server, over the real ZMQ
channel (``ipc://`` in a temporary folder); the e2e test scrapes a served ``/metrics``."""

from __future__ import annotations

import collections
import dataclasses
import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry
from vllm_tt_platform.config import cli_flags
from vllm_tt_platform.config.metrics_switch import enable_tt_metrics
from vllm_tt_platform.metrics.engine import NULL_STEP_METRICS, EngineMetrics, open_step_metrics
from vllm_tt_platform.metrics.frontend import Families, Receiver, TTStatLogger
from vllm_tt_platform.metrics.wire import StepDelta

LABELS = ("tiny", "0")


@dataclass
class Overlap:
    submitted: int = 0
    overlapped: int = 0
    drains: collections.Counter[str] = field(default_factory=collections.Counter)
    not_overlapped: collections.Counter[str] = field(default_factory=collections.Counter)
    discarded_tokens: int = 0


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"model_name": "tiny", "engine": "0", **labels})


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


@pytest.fixture
def address(tmp_path) -> str:
    return f"ipc://{tmp_path}/m-0"


def engine(address: str, overlap: Overlap, lanes: list[int], clock: list[float] | None = None) -> EngineMetrics:
    return EngineMetrics(address, rows_per_lane=4, lane_rows_used=lambda: list(lanes), overlap=overlap,
                         device_seconds=(lambda: clock[0]) if clock is not None else None, interval_s=0.05)


def test_steps_reach_the_series_with_their_phase_tokens_rows_sampling_and_lanes(address):
    registry = CollectorRegistry()
    receiver = Receiver(address, Families.create(registry), LABELS)
    overlap, lanes, clock = Overlap(), [3, 1], [0.0]
    metrics = engine(address, overlap, lanes, clock)
    try:
        metrics.step("prefill", tokens=100, rows_used=2, rows=8, sampling="device:device")
        clock[0] = 0.020
        metrics.step("decode", tokens=3, rows_used=3, rows=8, sampling="host:logit_bias")
        clock[0] = 0.025
        metrics.step("decode", tokens=4, rows_used=4, rows=8, sampling="device:device")
        overlap.submitted, overlap.overlapped = 2, 1
        overlap.drains["batch changed"] += 1
        overlap.not_overlapped["host sampling"] += 1
        wait_for(lambda: sample(registry, "vllm_tt:overlap_drains_total", reason="batch changed") == 1)
        assert sample(registry, "vllm_tt:steps_total", phase="prefill") == 1
        assert sample(registry, "vllm_tt:steps_total", phase="decode") == 2
        assert sample(registry, "vllm_tt:prefill_tokens_per_step_sum") == 100
        assert sample(registry, "vllm_tt:decode_rows_used_total") == 7
        assert sample(registry, "vllm_tt:decode_rows_total") == 16
        assert sample(registry, "vllm_tt:sampling_batches_total", path="host", reason="logit_bias") == 1
        assert sample(registry, "vllm_tt:sampling_batches_total", path="device", reason="device") == 2
        assert sample(registry, "vllm_tt:overlap_steps_total", outcome="submitted") == 2
        assert sample(registry, "vllm_tt:overlap_steps_total", outcome="overlapped") == 1
        assert sample(registry, "vllm_tt:decode_steps_not_overlapped_total", reason="host sampling") == 1
        # Device time between two step starts belongs to the earlier step.
        assert sample(registry, "vllm_tt:device_time_per_step_seconds_sum", phase="prefill") == pytest.approx(0.020)
        assert sample(registry, "vllm_tt:device_time_per_step_seconds_sum", phase="decode") == pytest.approx(0.005)
        assert sample(registry, "vllm_tt:lane_rows_used", lane="0") == 3
        assert sample(registry, "vllm_tt:lane_occupancy", lane="1") == 0.25
        # Counters are increments: a second flush of unchanged totals adds nothing.
        overlap.drains["batch changed"] += 1
        wait_for(lambda: sample(registry, "vllm_tt:overlap_drains_total", reason="batch changed") == 2)
        assert sample(registry, "vllm_tt:overlap_steps_total", outcome="submitted") == 2
        assert sample(registry, "vllm_tt:steps_total", phase="decode") == 2
    finally:
        metrics.close()
        receiver.close()


def test_steps_recorded_before_any_api_server_connects_are_not_lost(address):
    metrics = engine(address, Overlap(), [0])
    try:
        for _ in range(5):
            metrics.step("decode", tokens=1, rows_used=1, rows=4, sampling="device:device")
        time.sleep(0.2)  # several flushes with nobody to take them
        registry = CollectorRegistry()
        receiver = Receiver(address, Families.create(registry), LABELS)
        metrics.step("prefill", tokens=7, rows_used=1, rows=4, sampling="device:device")
        wait_for(lambda: sample(registry, "vllm_tt:steps_total", phase="prefill") == 1)
        assert sample(registry, "vllm_tt:steps_total", phase="decode") == 5
    finally:
        metrics.close()
        receiver.close()


def test_with_two_api_servers_each_delta_reaches_exactly_one(address):
    """``--api-server-count 2``: PUSH deals the deltas out; the servers' counters sum to the total
    (vLLM's multiprocess /metrics adds the processes' files the same way)."""
    registries = [CollectorRegistry(), CollectorRegistry()]
    receivers = [Receiver(address, Families.create(r), LABELS) for r in registries]
    metrics = engine(address, Overlap(), [0])
    try:
        time.sleep(0.2)  # both connected
        for _ in range(40):
            metrics.step("decode", tokens=1, rows_used=1, rows=4, sampling="device:device")
            time.sleep(0.01)

        def total() -> float:
            return sum(sample(r, "vllm_tt:steps_total", phase="decode") or 0 for r in registries)

        wait_for(lambda: total() == 40)
        assert all(receiver.received for receiver in receivers)
    finally:
        metrics.close()
        for receiver in receivers:
            receiver.close()


def test_a_scrape_that_sees_a_deltas_steps_sees_all_of_it():
    """The step counter is what readers wait on (the e2e test polls it): every other series of
    the delta is in when it moves (within one process; across the files of several API
    servers the e2e test waits for two equal scrapes)."""
    registry = CollectorRegistry()
    families = Families.create(registry)
    seen: list[tuple[float | None, ...]] = []

    class Watched:
        def __init__(self, child):
            self.child = child

        def inc(self, n: float) -> None:
            seen.append(tuple(sample(registry, name, **labels) for name, labels in (
                ("vllm_tt:prefill_tokens_per_step_sum", {}), ("vllm_tt:decode_rows_used_total", {}),
                ("vllm_tt:sampling_batches_total", {"path": "host", "reason": "logit_bias"}),
                ("vllm_tt:device_time_per_step_seconds_count", {"phase": "decode"}),
                ("vllm_tt:lane_rows_used", {"lane": "0"}))))
            self.child.inc(n)

    class WatchedSteps:
        def labels(self, *labels: str) -> Watched:
            return Watched(families.steps.labels(*labels))

    delta = StepDelta(steps={"prefill": 1, "decode": 2}, prefill_tokens=[60], decode_rows_used=5, decode_rows=8,
                      sampling={"host:logit_bias": 1}, device_s={"decode": [0.001, 0.001]}, lane_rows_used=[3],
                      rows_per_lane=4)
    dataclasses.replace(families, steps=WatchedSteps()).record(delta, LABELS)  # type: ignore[arg-type]
    assert seen == [(60.0, 5.0, 1.0, 2.0, 3.0)] * 2
    assert sample(registry, "vllm_tt:steps_total", phase="decode") == 2


def test_metrics_off_is_the_null_object_and_the_logger_stays_idle(monkeypatch):
    monkeypatch.delenv("VLLM_TT_METRICS", raising=False)
    assert open_step_metrics(0, rows_per_lane=4, lane_rows_used=list, overlap=Overlap(),
                             device_seconds=None) is NULL_STEP_METRICS
    logger = TTStatLogger(vllm_config=None, engine_index=0)  # type: ignore[arg-type]
    assert logger.receiver is None


@pytest.mark.parametrize(("parsed", "disable_log_stats", "on"), [
    (True, None, True), (True, True, False), (True, False, True), (False, None, False),
])
def test_only_the_serve_front_end_turns_metrics_on(monkeypatch, parsed, disable_log_stats, on):
    monkeypatch.setattr(cli_flags, "_parser_seen", parsed)
    monkeypatch.setattr(cli_flags, "_values", {} if disable_log_stats is None
                        else {"disable_log_stats": disable_log_stats})
    env: dict[str, str] = {}
    assert enable_tt_metrics(env) is on
    assert bool(env.get("VLLM_TT_METRICS", "").startswith("ipc://")) is on
    kept = {"VLLM_TT_METRICS": "ipc:///elsewhere"}
    enable_tt_metrics(kept)
    assert kept["VLLM_TT_METRICS"] == "ipc:///elsewhere"  # an engine or API server inherits it


def test_a_pending_delta_merges_counts_and_keeps_the_latest_lanes():
    pending = StepDelta(steps={"decode": 2}, lane_rows_used=[1], rows_per_lane=4)
    pending.merge(StepDelta(steps={"decode": 1, "prefill": 1}, prefill_tokens=[9], lane_rows_used=[3],
                            rows_per_lane=4))
    assert pending.steps == {"decode": 3, "prefill": 1}
    assert pending.prefill_tokens == [9]
    assert pending.lane_rows_used == [3]
