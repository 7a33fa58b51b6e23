"""The vLLM API differences inside the support window that the scheduler must absorb.

Each shim probes vLLM's API (a dataclass field, an attribute) rather than its version, and
has a tombstone in ``tests/test_compat.py`` that fails once the lowest supported vLLM no
longer needs it. docs/support-policy.md says how shims are added and removed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler

_OUTPUT_FIELDS = frozenset(f.name for f in dataclasses.fields(SchedulerOutput))

HAS_ENCODER_INPUT_UPDATES = "encoder_input_updates" in _OUTPUT_FIELDS
"""``SchedulerOutput.encoder_input_updates`` (added in vLLM 0.33). Without it the scheduler
drains no per-step encoder updates, so there is nothing to carry between passes."""


def encoder_input_updates(output: SchedulerOutput) -> dict[str, dict[int, Any]]:
    """The pass's encoder input updates, or ``{}`` where vLLM has no such field."""
    if not HAS_ENCODER_INPUT_UPDATES:
        return {}
    return output.encoder_input_updates


HAS_SKIP_DRAFTS = "skip_drafts" in _OUTPUT_FIELDS
"""``SchedulerOutput.skip_drafts`` (added in vLLM 0.33); older releases never skip drafts."""

HAS_ACCEPTABLE_DRAFTS = "num_acceptable_drafts" in {f.name for f in dataclasses.fields(GrammarOutput)}
"""``GrammarOutput.num_acceptable_drafts`` (added in vLLM 0.32): a per-row limit on draft tokens
that older releases do not have (those releases then put no limit on a row's drafts)."""


def acceptable_drafts(output: GrammarOutput) -> list[int] | None:
    """The rows' draft limits, or ``None`` (no limit) where vLLM has no such field."""
    return output.num_acceptable_drafts if HAS_ACCEPTABLE_DRAFTS else None


def grammar_output(request_ids: list[str], bitmask: np.ndarray, drafts: list[int] | None) -> GrammarOutput:
    """A ``GrammarOutput``; ``drafts`` is dropped where vLLM has no ``num_acceptable_drafts``."""
    if HAS_ACCEPTABLE_DRAFTS:
        return GrammarOutput(request_ids, bitmask, num_acceptable_drafts=drafts)
    return GrammarOutput(request_ids, bitmask)


HAS_SCHEDULER_HAS_REQUEST = hasattr(Scheduler, "has_request")
"""``Scheduler.has_request`` (part of the scheduler interface from vLLM 0.33)."""


def whole_mm_items(mm_features: Any, num_computed_tokens: int, num_new_tokens: int) -> int:
    """``num_new_tokens`` shortened so that the chunk ``[num_computed_tokens, +num_new_tokens)``
    ends before the first multimodal item it would only partly cover (vLLM 0.33's rule for
    ``disable_chunked_mm_input``); a chunk starting inside an item (a prefix-cache hit) is left."""
    end = num_computed_tokens + num_new_tokens
    for feature in mm_features or ():
        start = feature.mm_position.offset
        if num_computed_tokens <= start < end < start + feature.mm_position.length:
            return start - num_computed_tokens
    return num_new_tokens


class SchedulerBackports(Scheduler):
    """vLLM's ``Scheduler`` plus the methods later releases added, where this one lacks them."""

    def _try_schedule_encoder_inputs(self, request: Any, num_computed_tokens: int, num_new_tokens: int,
                                     *args: Any, **kwargs: Any) -> Any:
        """Images are never split over prefill chunks (``disable_chunked_mm_input``), but vLLM
        0.31 skips that rule for an image another request scheduled in the same step or the
        encoder cache holds, and 0.31/0.32 split an image a chunk starts exactly at: the chunk
        is shortened here by 0.33's rule (``whole_mm_items``) before vLLM schedules it."""
        if self.scheduler_config.disable_chunked_mm_input and not self.is_encoder_decoder:
            num_new_tokens = whole_mm_items(request.mm_features, num_computed_tokens, num_new_tokens)
        return super()._try_schedule_encoder_inputs(request, num_computed_tokens, num_new_tokens, *args, **kwargs)

    if not HAS_SCHEDULER_HAS_REQUEST:

        def has_request(self, request_id: str) -> bool:
            """Whether the scheduler holds the request (0.33's definition: it is in ``requests``)."""
            return request_id in self.requests
