"""The step outcomes a Tenstorrent mesh can run, and a runner-side check.

A mesh replays captured traces of fixed shape: one family for prefill, one for decode.
A step that mixes the two has no trace, so the scheduler emits a prefill-only, a
decode-only, or an empty step; for a model that captures mixed programs (``mixed_shapes``,
with ``tt.mixed_steps`` on) also a mixed step: decode rows and one prompt chunk. This module
has no heavy imports, so the model runner can use the same enum to check the step it receives.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Sequence
from typing import Protocol


class Phase(enum.Enum):
    """What one engine step does on the device."""

    PREFILL = "prefill"
    DECODE = "decode"
    EMPTY = "empty"
    MIXED = "mixed"
    """Decode rows and one prompt chunk in one program (a model's ``mixed_shapes``)."""


class MixedStepError(RuntimeError):
    """A step carries both prefill and decode rows, and no trace can run it: the model runs no
    mixed steps, or the step has more than one prompt chunk."""

    def __init__(self, prefill_req_ids: Sequence[str], decode_req_ids: Sequence[str], mixed: bool = False) -> None:
        self.prefill_req_ids = tuple(prefill_req_ids)
        self.decode_req_ids = tuple(decode_req_ids)
        why = ("a mixed step holds one prompt chunk" if mixed
               else "mixed steps are off (tt.mixed_steps, a model declaring mixed_shapes)")
        super().__init__(
            "mixed prefill/decode step: prefill rows "
            f"{list(self.prefill_req_ids)}, decode rows {list(self.decode_req_ids)}; {why}: "
            "the TT scheduler must never emit this (is scheduler_cls a TT scheduler?)"
        )


class _NewRequest(Protocol):
    req_id: str


class _CachedRequests(Protocol):
    req_ids: list[str]
    resumed_req_ids: set[str]


class _StepOutput(Protocol):
    # Read-only members, so vLLM's concrete (mutable) field types match.
    @property
    def scheduled_new_reqs(self) -> Sequence[_NewRequest]: ...
    @property
    def scheduled_cached_reqs(self) -> _CachedRequests: ...
    @property
    def total_num_scheduled_tokens(self) -> int: ...


def leaves_prefill_pending(chunk_end: int, num_tokens: int) -> bool:
    """Whether a chunk ending at ``chunk_end`` leaves its request mid-prefill: it stopped short
    of the request's last known token, so nothing is sampled (vLLM's ``is_prefill_chunk``).

    The next chunk is a prefill row even when it is a single token: the scheduler put it
    beside other prefills, so counting tokens (``computed == num_tokens - 1`` looks like a
    decode) must not decide the phase; this record does.
    """
    return chunk_end < num_tokens


def prefill_rows(scheduler_output: _StepOutput, mid_prefill: Container[str]) -> tuple[list[str], list[str]]:
    """The ids of the step's prefill rows and decode rows: a row is prefill when its request is
    new, resumed (replaying after preemption), or was left mid-prefill by an earlier chunk
    (``mid_prefill``, the runner's own record: the ids whose last scheduled chunk
    ``leaves_prefill_pending``); every other cached row is a decode."""
    cached = scheduler_output.scheduled_cached_reqs
    prefill_ids = [req.req_id for req in scheduler_output.scheduled_new_reqs]
    decode_ids: list[str] = []
    resumed = cached.resumed_req_ids
    for req_id in cached.req_ids:
        if req_id in resumed or req_id in mid_prefill:
            prefill_ids.append(req_id)
        else:
            decode_ids.append(req_id)
    return prefill_ids, decode_ids


def step_phase(scheduler_output: _StepOutput, mid_prefill: Container[str], mixed: bool = False) -> Phase:
    """Classify a scheduler output the way the runner sees it (rows as ``prefill_rows``).

    Both kinds in one step are a mixed step when ``mixed`` (the model runs mixed steps) and
    exactly one row is prefill; otherwise they raise ``MixedStepError``.
    """
    if scheduler_output.total_num_scheduled_tokens == 0:
        return Phase.EMPTY
    prefill_ids, decode_ids = prefill_rows(scheduler_output, mid_prefill)
    if prefill_ids and decode_ids:
        if mixed and len(prefill_ids) == 1:
            return Phase.MIXED
        raise MixedStepError(prefill_ids, decode_ids, mixed)
    return Phase.PREFILL if prefill_ids else Phase.DECODE
