"""Sampling trace: one JSON line per engine step saying where the batch sampled and why.

A host fallback costs a logits read-back per step and is otherwise invisible, so the runner
records every decision. Off by default: the runner always calls ``record``, which lands on
``NullSamplingTrace`` unless ``TT_SAMPLING_TRACE`` names a file (read when the runner starts,
the same pattern as the scheduler's ``TT_STEP_TRACE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import IO, Protocol

from vllm_tt_sampling.decision import SamplingDecision

from vllm_tt_platform.envs import TT_SAMPLING_TRACE


class SamplingTrace(Protocol):
    def record(self, step: int, phase: str, decision: SamplingDecision, req_ids: Sequence[str]) -> None: ...

    def close(self) -> None: ...


class NullSamplingTrace:
    """Tracing off: every call is a no-op."""

    def record(self, step: int, phase: str, decision: SamplingDecision, req_ids: Sequence[str]) -> None:
        return None

    def close(self) -> None:
        return None


class JsonlSamplingTrace:
    """``{"step", "phase", "path", "reason", "requests"}`` per step, line-buffered so a crash
    keeps what was written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def record(self, step: int, phase: str, decision: SamplingDecision, req_ids: Sequence[str]) -> None:
        if self._file is None:
            return
        line = {"step": step, "phase": phase, "path": decision.path.value, "reason": decision.reason,
                "requests": sorted(req_ids)}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def open_sampling_trace(environ: Mapping[str, str] | None = None) -> SamplingTrace:
    """The trace ``TT_SAMPLING_TRACE`` asks for; the null trace when it is unset or empty."""
    path = TT_SAMPLING_TRACE.read(environ)
    return JsonlSamplingTrace(path) if path else NullSamplingTrace()
