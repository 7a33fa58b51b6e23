"""What travels from the engine to the API servers: one ``StepDelta`` per flush, and where.

Counters are increments since the previous flush; the per-step observations are raw values
(a few per flush), so every API server builds the same histograms from them; gauges are the
latest value.
"""

from __future__ import annotations

import msgspec

from vllm_tt_platform.envs import VLLM_TT_METRICS

MAX_OBSERVATIONS = 10_000
"""Per flush: beyond this (no API server has read for a long while) observations are dropped."""


class StepDelta(msgspec.Struct, kw_only=True):
    steps: dict[str, int] = {}
    """phase -> engine steps that ran the model."""
    prefill_tokens: list[int] = []
    """Tokens of each prefill step."""
    decode_rows_used: int = 0
    """Rows holding a request, summed over decode steps."""
    decode_rows: int = 0
    """Rows of the fixed decode batch (the trace's rows), summed over decode steps."""
    sampling: dict[str, int] = {}
    """``"<path>:<reason>"`` -> batches (vllm_tt_sampling's decision)."""
    overlap: dict[str, int] = {}
    """``"kept"`` / ``"drained:<reason>"`` / ``"sync:<reason>"`` / ``"discarded_tokens"`` -> increments."""
    device_s: dict[str, list[float]] = {}
    """phase -> modelled device seconds of each step (only where the mesh models device time)."""
    lane_rows_used: list[int] | None = None
    """Latest rows in use per lane."""
    rows_per_lane: int = 0

    def empty(self) -> bool:
        return not (self.steps or self.sampling or self.overlap or self.lane_rows_used is not None)

    def merge(self, newer: StepDelta) -> None:
        """Fold ``newer`` into this delta (a flush nobody received yet)."""
        for mine, theirs in ((self.steps, newer.steps), (self.sampling, newer.sampling),
                             (self.overlap, newer.overlap)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.prefill_tokens = (self.prefill_tokens + newer.prefill_tokens)[-MAX_OBSERVATIONS:]
        for phase, values in newer.device_s.items():
            self.device_s[phase] = (self.device_s.get(phase, []) + values)[-MAX_OBSERVATIONS:]
        self.decode_rows_used += newer.decode_rows_used
        self.decode_rows += newer.decode_rows
        if newer.lane_rows_used is not None:
            self.lane_rows_used, self.rows_per_lane = newer.lane_rows_used, newer.rows_per_lane


ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(StepDelta)


def engine_address(engine_index: int, environ: dict[str, str] | None = None) -> str | None:
    """Where engine ``engine_index`` publishes; None when TT metrics are off."""
    base = VLLM_TT_METRICS.read(environ)
    return f"{base}-{engine_index}" if base else None
