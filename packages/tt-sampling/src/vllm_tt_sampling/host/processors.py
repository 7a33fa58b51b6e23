"""vLLM logits processors driven over the runner's fixed slots.

vLLM's processors keep per-request state keyed by persistent-batch index and expect logits with
one row per index. Here the index is the slot (a request keeps its slot for life), the batch size
is the slot count, and adds/removes reach the processors as ``BatchUpdate``s. A call that samples
only some slots is widened to a slot-indexed scratch tensor around the processors, so their
indices stay valid without moving requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    LogitsProcessors,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from vllm.v1.sample.logits_processor.interface import AddedRequest

_BUILTIN = (MinTokensLogitsProcessor, LogitBiasLogitsProcessor, MinPLogitsProcessor)
_SAMPLING_EPS = 1e-5


def uses_builtin_processors(params: SamplingParams) -> bool:
    """Whether vLLM's built-in processors (min_tokens, logit_bias, min_p) act on this request."""
    return params.min_tokens > 0 or bool(params.logit_bias) or params.min_p > _SAMPLING_EPS


class _SlotWidthGroup:
    """Runs a list of processors on the rows of one call, widened to slot indices."""

    def __init__(self, owner: SlotLogitsProcessors, members: list[LogitsProcessor]) -> None:
        self._owner = owner
        self._members = members

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows = self._owner.rows
        if rows is None:
            for member in self._members:
                logits = member.apply(logits)
            return logits
        wide = self._owner.scratch(logits)
        wide.index_copy_(0, rows, logits)
        for member in self._members:
            wide = member.apply(wide)
        return wide.index_select(0, rows)


class SlotLogitsProcessors:
    def __init__(self, processors: LogitsProcessors, num_slots: int, vocab_size: int) -> None:
        self._processors = processors
        self._num_slots = num_slots
        self._vocab_size = vocab_size
        self._added: dict[int, AddedRequest] = {}
        self._removed: set[int] = set()
        self._users: set[int] = set()
        self._custom = any(not isinstance(p, _BUILTIN) for p in processors.all)
        self._scratch: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        """Slot of each row of the current call; None when rows are exactly slots 0..n-1."""
        self._view = LogitsProcessors()
        self._view.argmax_invariant = self._groups(processors.argmax_invariant)
        self._view.non_argmax_invariant = self._groups(processors.non_argmax_invariant)

    def _groups(self, members: list[LogitsProcessor]) -> list:
        return [_SlotWidthGroup(self, members)] if members else []

    def add(self, slot: int, params: SamplingParams, prompt: list[int], output: list[int]) -> None:
        # An add replaces whatever the processors hold for the slot, so a pending removal of
        # the same slot must not also be sent (vLLM applies adds before removals).
        self._removed.discard(slot)
        self._added[slot] = (slot, params, prompt, output)
        if uses_builtin_processors(params):
            self._users.add(slot)
        else:
            self._users.discard(slot)

    def remove(self, slot: int) -> None:
        self._added.pop(slot, None)
        self._removed.add(slot)
        self._users.discard(slot)

    def step(self, slots: Sequence[int]) -> LogitsProcessors:
        """Bring the processors up to date (every call, as vLLM does each step) and return what
        ``SamplingMetadata.logitsprocs`` should hold for a call sampling ``slots``."""
        update = None
        if self._added or self._removed:
            update = BatchUpdate(
                batch_size=self._num_slots,
                removed=sorted(self._removed, reverse=True),
                added=list(self._added.values()),
                moved=[],
            )
            self._added = {}
            self._removed = set()
        for processor in self._processors.all:
            processor.update_state(update)
        if not (self._custom or self._users):
            return LogitsProcessors()
        identity = list(slots) == list(range(self._num_slots))
        self.rows = None if identity else torch.tensor(list(slots), dtype=torch.int64)
        return self._view

    def scratch(self, like: torch.Tensor) -> torch.Tensor:
        """Slot-indexed ``[num_slots, vocab]`` buffer, allocated once; rows of slots not in the
        call hold stale values the processors may touch harmlessly."""
        if self._scratch is None or self._scratch.dtype != like.dtype:
            self._scratch = torch.zeros(
                (self._num_slots, self._vocab_size), dtype=like.dtype, device=like.device
            )
        return self._scratch
