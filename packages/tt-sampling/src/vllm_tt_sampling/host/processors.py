"""vLLM logits processors driven over the runner's fixed slots.

vLLM's processors keep per-request state keyed by persistent-batch index and expect logits with
one row per index. Here the index is the slot (a request keeps its slot for life), the batch size
is the slot count, and adds/removes reach the processors as ``BatchUpdate``s. A call that samples
only some slots is widened to a slot-indexed scratch tensor around the processors, so their
indices stay valid without moving requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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

from vllm_tt_sampling.host.thinking_budget import SlotThinkingBudget

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
        return self._owner.on_slots(logits, self._apply_members)

    def _apply_members(self, logits: torch.Tensor) -> torch.Tensor:
        for member in self._members:
            logits = member.apply(logits)
        return logits


class SlotLogitsProcessors:
    def __init__(self, processors: LogitsProcessors, num_slots: int, vocab_size: int,
                 reasoning_config: Any = None) -> None:
        """``reasoning_config``: vLLM's (``VllmConfig.reasoning_config``); set, requests'
        ``thinking_token_budget`` is applied (``thinking_budget``)."""
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
        self.thinking_budget = None if reasoning_config is None else SlotThinkingBudget(
            reasoning_config, num_slots, lambda: self.rows, self.on_slots)
        """vLLM's thinking-budget state over the slots, for ``SamplingMetadata``; None when
        reasoning is off (vLLM then refuses a budget when the request arrives)."""

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
        if self.thinking_budget is not None and update is not None:
            self.thinking_budget.sync_batch(update)
        identity = list(slots) == list(range(self._num_slots))
        self.rows = None if identity else torch.tensor(list(slots), dtype=torch.int64)
        if not (self._custom or self._users):
            return LogitsProcessors()
        return self._view

    def on_slots(self, logits: torch.Tensor, apply: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``apply`` (an edit that indexes rows by slot) on the current call's rows: widened to
        the slot-indexed scratch when the rows are not exactly slots 0..n-1."""
        if self.rows is None:
            return apply(logits)
        wide = self.scratch(logits)
        wide.index_copy_(0, self.rows, logits)
        return apply(wide).index_select(0, self.rows)

    def scratch(self, like: torch.Tensor) -> torch.Tensor:
        """Slot-indexed ``[num_slots, vocab]`` buffer, allocated once; rows of slots not in the
        call hold stale values the processors may touch harmlessly."""
        if self._scratch is None or self._scratch.dtype != like.dtype:
            self._scratch = torch.zeros(
                (self._num_slots, self._vocab_size), dtype=like.dtype, device=like.device
            )
        return self._scratch
