"""The API-server side of the TT metrics: a ``vllm.stat_logger_plugins`` logger that receives
the engine's step deltas and records them as ``vllm_tt:*`` Prometheus series.

vLLM builds one logger per engine in every API server process; each connects a PULL socket to
its engine and records on a receiver thread, into the process's default Prometheus registry
(multiprocess files when ``--api-server-count > 1``, which vLLM's ``/metrics`` sums). Without
``VLLM_TT_METRICS`` (not a TT server, or ``--disable-log-stats``) the logger does nothing.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import zmq
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from vllm.logger import init_logger
from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_tt_platform.metrics.wire import DECODER, StepDelta, engine_address

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("vllm." + __name__)

LABELS = ("model_name", "engine")
TOKEN_BUCKETS = tuple(float(2**i) for i in range(4, 18))
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class Families:
    """The ``vllm_tt:*`` series (named like vLLM's ``vllm:*``; counters end in ``_total``)."""

    steps: Counter
    prefill_tokens: Histogram
    decode_rows_used: Counter
    decode_rows: Counter
    sampling: Counter
    overlap_steps: Counter
    overlap_drains: Counter
    not_overlapped: Counter
    discarded_tokens: Counter
    device_time: Histogram
    lane_rows_used: Gauge
    lane_occupancy: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> Families:
        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=registry)

        def gauge(name: str, doc: str, *extra: str) -> Gauge:
            return Gauge(name, doc, [*LABELS, *extra], registry=registry, multiprocess_mode="mostrecent")

        return cls(
            steps=counter("vllm_tt:steps", "Engine steps that ran the model, by phase.", "phase"),
            prefill_tokens=Histogram("vllm_tt:prefill_tokens_per_step", "Tokens of each prefill step.",
                                     LABELS, buckets=TOKEN_BUCKETS, registry=registry),
            decode_rows_used=counter("vllm_tt:decode_rows_used", "Rows holding a request, summed over decode steps."),
            decode_rows=counter("vllm_tt:decode_rows", "Rows of the fixed decode batch (trace rows), summed over "
                                "decode steps; decode_rows_used / decode_rows is the batch's fill."),
            sampling=counter("vllm_tt:sampling_batches", "Batches by where they sampled (device or host) and why.",
                             "path", "reason"),
            overlap_steps=counter("vllm_tt:overlap_steps", "Decode steps submitted without waiting for their "
                                  "tokens (submitted), and of those, behind a step in flight (overlapped).",
                                  "outcome"),
            overlap_drains=counter("vllm_tt:overlap_drains", "Drains of the overlapped-decode queue, by reason.",
                                   "reason"),
            not_overlapped=counter("vllm_tt:decode_steps_not_overlapped", "Decode steps run synchronously while "
                                   "overlap is on, by reason.", "reason"),
            discarded_tokens=counter("vllm_tt:overlap_discarded_tokens", "Tokens computed for requests that left "
                                     "the batch before their overlapped step was applied."),
            device_time=Histogram("vllm_tt:device_time_per_step_seconds", "Modelled device time of each step, by "
                                  "phase (only where the mesh models device time: host backend host_device_time).",
                                  [*LABELS, "phase"], buckets=SECONDS_BUCKETS, registry=registry),
            lane_rows_used=gauge("vllm_tt:lane_rows_used", "Decode rows holding a request, per lane.", "lane"),
            lane_occupancy=gauge("vllm_tt:lane_occupancy", "Fraction of a lane's decode rows holding a request.",
                                 "lane"),
        )

    def record(self, delta: StepDelta, labels: tuple[str, str]) -> None:
        """The step counts go in last: they are what a reader waits on, so a scrape of this
        process's registry that shows a delta's steps shows the rest of that delta too. (With
        several API servers ``/metrics`` reads each process's counter and histogram files one
        after the other, which no order here makes one snapshot.)"""
        prefill = self.prefill_tokens.labels(*labels)
        for tokens in delta.prefill_tokens:
            prefill.observe(tokens)
        if delta.decode_rows:
            self.decode_rows_used.labels(*labels).inc(delta.decode_rows_used)
            self.decode_rows.labels(*labels).inc(delta.decode_rows)
        for key, n in delta.sampling.items():
            path, _, reason = key.partition(":")
            self.sampling.labels(*labels, path, reason).inc(n)
        for key, n in delta.overlap.items():
            kind, _, reason = key.partition(":")
            if kind == "drained":
                self.overlap_drains.labels(*labels, reason).inc(n)
            elif kind == "sync":
                self.not_overlapped.labels(*labels, reason).inc(n)
            elif kind == "discarded_tokens":
                self.discarded_tokens.labels(*labels).inc(n)
            else:
                self.overlap_steps.labels(*labels, kind).inc(n)
        for phase, values in delta.device_s.items():
            histogram = self.device_time.labels(*labels, phase)
            for seconds in values:
                histogram.observe(seconds)
        if delta.lane_rows_used is not None:
            for lane, used in enumerate(delta.lane_rows_used):
                self.lane_rows_used.labels(*labels, str(lane)).set(used)
                self.lane_occupancy.labels(*labels, str(lane)).set(used / max(delta.rows_per_lane, 1))
        for phase, n in delta.steps.items():
            self.steps.labels(*labels, phase).inc(n)


@functools.cache
def default_families() -> Families:
    """Once per process: vLLM builds one logger per engine, all share the series."""
    return Families.create(REGISTRY)


class Receiver:
    """A PULL socket to one engine and the thread recording what arrives."""

    def __init__(self, address: str, families: Families, labels: tuple[str, str]) -> None:
        self.families = families
        self.labels = labels
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.connect(address)
        self._stop = threading.Event()
        self.received = 0
        self._thread = threading.Thread(target=self._run, name=f"tt-metrics-{labels[1]}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(200):
                continue
            try:
                delta = DECODER.decode(self._socket.recv())
            except msgspec.DecodeError:
                logger.warning("TT metrics: dropped a message that is not a step delta")
                continue
            self.families.record(delta, self.labels)
            self.received += 1
        self._socket.close(linger=0)
        self._context.term()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class TTStatLogger(StatLoggerBase):
    """vLLM's stat-logger plugin entry point (``vllm.stat_logger_plugins: tt``)."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.receiver: Receiver | None = None
        address = engine_address(engine_index)
        if address is None:
            return
        model = vllm_config.model_config
        name = model.served_model_name if model is not None else ""
        self.receiver = Receiver(address, default_families(), (str(name), str(engine_index)))

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        """The TT series arrive on the receiver thread, not with vLLM's stats."""

    def log_engine_initialized(self) -> None:
        pass
