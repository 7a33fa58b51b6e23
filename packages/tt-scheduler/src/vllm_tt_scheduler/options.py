"""Scheduler options read from ``--additional-config`` (``tt`` section).

The platform owns the typed, user-facing config and validates it; this module reads
the few keys the scheduler needs and re-checks them cheaply, so a scheduler built
outside the platform (tests, benchmarks) still fails with a clear message.
No vLLM import here: the platform imports ``DEFAULT_PREFILL_BURST`` at config time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Consecutive prefill steps allowed while decodes wait (see docs/scheduling.md for the
# benchmark that picked it).
DEFAULT_PREFILL_BURST = 2

# New prompts wait (to share one prefill step) until the request-steps they have waited
# reach this multiple of the decode steps their prefill would stall; 0 admits at once.
# See ``policy.PhasePolicy`` and docs/scheduling.md for the benchmark behind it.
DEFAULT_PREFILL_HOLD = 0.35

#: Keys this package reads from ``additional_config["tt"]``. ``_``-prefixed keys are
#: set by the platform, never by users.
CONFIG_KEYS = ("prefill_burst", "prefill_hold", "_prefill_trace_lens")


@dataclass(frozen=True)
class SchedulerOptions:
    """Policy knobs of the phase scheduler."""

    prefill_burst: int = DEFAULT_PREFILL_BURST
    """Consecutive prefill steps allowed while decodes are running; then one decode."""

    prefill_hold: float = DEFAULT_PREFILL_HOLD
    """How long new prompts may wait to be batched into one prefill step (see
    ``policy.PhasePolicy.hold_ratio``); trades time-to-first-token for decode stalls."""

    prefill_chunk_cap: int | None = None
    """Largest prefill chunk per request (the model's largest prefill trace length),
    or None when the model declares no trace shapes (the step budget then rules)."""

    @classmethod
    def from_additional_config(cls, additional_config: object) -> SchedulerOptions:
        """Read the ``tt`` section; raise ``ValueError`` naming the key on a bad value."""
        if additional_config is not None and not isinstance(additional_config, Mapping):
            raise ValueError(f"additional_config must be a mapping, got {type(additional_config).__name__}")
        tt = (additional_config or {}).get("tt", {}) or {}
        if not isinstance(tt, Mapping):
            raise ValueError(f"additional_config['tt'] must be a mapping, got {type(tt).__name__}")
        burst = tt.get("prefill_burst", DEFAULT_PREFILL_BURST)
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(
                f"--additional-config tt.prefill_burst={burst!r} is invalid: "
                f"use an integer >= 1 (default {DEFAULT_PREFILL_BURST})"
            )
        hold = tt.get("prefill_hold", DEFAULT_PREFILL_HOLD)
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not 0 <= hold < float("inf"):
            raise ValueError(
                f"--additional-config tt.prefill_hold={hold!r} is invalid: use a number >= 0 "
                f"(default {DEFAULT_PREFILL_HOLD}; 0 admits new prompts at once)"
            )
        return cls(
            prefill_burst=burst,
            prefill_hold=float(hold),
            prefill_chunk_cap=_chunk_cap(tt.get("_prefill_trace_lens")),
        )


def _chunk_cap(trace_lens: Sequence[int] | None) -> int | None:
    if trace_lens is None:
        return None
    if isinstance(trace_lens, str | bytes) or not isinstance(trace_lens, Sequence):
        raise ValueError(
            f"additional_config tt._prefill_trace_lens={trace_lens!r} must be a list of "
            "positive ints (set by the platform from the model's declared trace shapes)"
        )
    if not trace_lens:
        return None
    for length in trace_lens:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(
                f"additional_config tt._prefill_trace_lens={list(trace_lens)!r} must hold positive ints only"
            )
    return max(trace_lens)
