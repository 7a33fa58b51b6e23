"""The runner's persistent batch: every live request, the decode slot it holds, its tokens
and its KV blocks, kept in step with the scheduler's outputs.

A request holds one slot (a row of the fixed decode batch) from admission until it finishes
or is preempted; lane ``i`` owns slots ``[i*rows, (i+1)*rows)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput


@dataclass
class RequestState:
    req_id: str
    slot: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    blocks: list[list[int]]
    """One block-id list per KV cache group (vLLM's order); position ``j`` of a list holds the
    request's tokens ``[j * block_size, (j + 1) * block_size)`` in that group."""
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    """Live list: appended by the runner after each sampled token (the host sampler reads it
    for penalties and min_tokens)."""
    generator: torch.Generator | None = None
    mm_features: list[Any] = field(default_factory=list)
    """vLLM's ``MultiModalFeatureSpec`` of each multimodal item, in prompt order (kept across
    preemption: a resumed request is prefilled again from its whole history)."""
    mid_prefill: bool = False
    """The last scheduled chunk stopped short of the last known token (``StepPlan.build``
    records it; vLLM's ``is_prefill_chunk``): the next chunk is a prefill row."""
    rope_delta: int = 0
    """mRoPE models: the position delta the request's last prefill returned (decode position =
    ``num_computed_tokens + rope_delta``)."""

    @property
    def block_ids(self) -> list[int]:
        """The first KV cache group's blocks (``page_table``'s rows)."""
        return self.blocks[0]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self, end: int) -> list[int]:
        """The first ``end`` tokens of prompt + output."""
        prompt = self.prompt_token_ids
        if end <= len(prompt):
            return prompt[:end]
        return prompt + self.output_token_ids[: end - len(prompt)]

    @property
    def last_token(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]


class SlotsExhaustedError(RuntimeError):
    """The scheduler admitted more requests than the decode batch has rows."""


class BlockCopiesError(RuntimeError):
    """vLLM asked the worker to copy KV blocks (``kv_cache_block_copies``: its copy-on-write of a
    recurrent state for a prefix hit inside a block), which the TT runner does not do; the
    startup checks refuse what leads there (``--prefix-match-unit`` below the block size)."""


class PersistentBatch:
    def __init__(self, lanes: int, rows_per_lane: int) -> None:
        self.lanes = lanes
        self.rows_per_lane = rows_per_lane
        self.requests: dict[str, RequestState] = {}
        self._free = [list(range(lane * rows_per_lane, (lane + 1) * rows_per_lane)) for lane in range(lanes)]
        self._lane_of: dict[str, int] = {}
        """Lane a request was placed in; kept across preemption so it resumes in its lane."""
        self._preempted: dict[str, RequestState] = {}

    @property
    def num_slots(self) -> int:
        return self.lanes * self.rows_per_lane

    def __iter__(self) -> Iterator[RequestState]:
        return iter(self.requests.values())

    def lane_of_slot(self, slot: int) -> int:
        return slot // self.rows_per_lane

    def _take_slot(self, req_id: str, lane: int) -> int:
        free = self._free[lane]
        if not free:
            raise SlotsExhaustedError(
                f"lane {lane} has no free decode row for request {req_id!r}: "
                f"{self.rows_per_lane} rows, all held"
            )
        free.sort()
        return free.pop(0)

    def _release(self, req_id: str) -> RequestState | None:
        state = self.requests.pop(req_id, None)
        if state is not None:
            self._free[self.lane_of_slot(state.slot)].append(state.slot)
        return state

    def add(self, req_id: str, prompt: list[int], params: SamplingParams, blocks: Sequence[list[int]],
            num_computed_tokens: int, lane: int, mm_features: Sequence[Any] = ()) -> RequestState:
        self._lane_of[req_id] = lane
        slot = self._take_slot(req_id, lane)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed)
        state = RequestState(req_id, slot, list(prompt), params, [list(group) for group in blocks],
                             num_computed_tokens, generator=generator, mm_features=list(mm_features))
        self.requests[req_id] = state
        return state

    def finish(self, req_id: str) -> RequestState | None:
        self._lane_of.pop(req_id, None)
        self._preempted.pop(req_id, None)
        return self._release(req_id)

    def preempt(self, req_id: str) -> RequestState | None:
        """Free the slot; the state (tokens, generator) is kept for the resume."""
        return self._release(req_id)

    def update(self, out: SchedulerOutput, lane_for_new: dict[str, int] | None = None,
               ) -> tuple[list[RequestState], list[RequestState], list[RequestState]]:
        """Apply one scheduler output. Returns the states that took a slot (new, resumed) and
        those that gave one back (finished, preempted)."""
        if out.kv_cache_block_copies:
            pairs = [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies]
            raise BlockCopiesError(f"vLLM asked the TT runner to copy KV blocks {pairs} (source, destination), "
                                   "which it does not do: serve without --prefix-match-unit")
        removed: list[RequestState] = []
        for req_id in out.finished_req_ids:
            state = self.finish(req_id)
            if state is not None:
                removed.append(state)
        for req_id in out.preempted_req_ids or ():
            state = self.preempt(req_id)
            if state is not None:
                self._preempted[req_id] = state
                removed.append(state)
        added: list[RequestState] = []
        for new in out.scheduled_new_reqs:
            lane = (lane_for_new or {}).get(new.req_id, 0)
            params = new.sampling_params
            if params is None or new.prompt_token_ids is None:
                raise ValueError(f"request {new.req_id!r} has no sampling params or prompt token ids")
            added.append(self.add(new.req_id, new.prompt_token_ids, params, new.block_ids,
                                  new.num_computed_tokens, lane, new.mm_features or ()))
        resumed: list[RequestState] = []
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in cached.resumed_req_ids:
                state = self._resume(req_id, cached.all_token_ids.get(req_id))
                resumed.append(state)
                new_blocks = cached.new_block_ids[i]
                if new_blocks is not None:
                    state.blocks = [list(group) for group in new_blocks]
                else:
                    state.blocks = [[] for _ in state.blocks]
            else:
                state = self.requests[req_id]
                new_blocks = cached.new_block_ids[i]
                if new_blocks is not None:
                    for held, added_ids in zip(state.blocks, new_blocks, strict=True):
                        held.extend(added_ids)
            state.num_computed_tokens = cached.num_computed_tokens[i]
        return added, resumed, removed

    def _resume(self, req_id: str, all_token_ids: list[int] | None) -> RequestState:
        state = self.requests.get(req_id) or self._preempted.pop(req_id, None)
        if state is None:
            raise KeyError(f"resumed request {req_id!r} is unknown to the runner")
        if req_id not in self.requests:
            lane = self._lane_of.get(req_id, 0)
            state.slot = self._take_slot(req_id, lane)
            self.requests[req_id] = state
        if all_token_ids is not None:
            # The scheduler is authoritative: it may have dropped stale in-flight tokens.
            state.output_token_ids[:] = all_token_ids[len(state.prompt_token_ids):]
        return state
