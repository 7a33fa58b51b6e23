"""Hand-built vLLM scheduler outputs: the real ``SchedulerOutput`` / ``NewRequestData`` /
``CachedRequestData`` types with only what a model runner reads filled in, for driving a runner
step by step without a scheduler."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

BlockIds = tuple[list[int], ...]
"""Block ids per KV cache group, as vLLM sends them (one group: ``([1, 2],)``)."""


def greedy(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def new_request(req_id: str, prompt: list[int], blocks: list[int], *, computed: int = 0,
                params: SamplingParams | None = None) -> NewRequestData:
    """A request scheduled for the first time (one KV group); ``computed``: prefix-cached tokens."""
    return NewRequestData(
        req_id=req_id, prompt_token_ids=list(prompt), mm_features=[], sampling_params=params or greedy(),
        pooling_params=None, block_ids=(list(blocks),), num_computed_tokens=computed, lora_request=None,
    )


def cached_requests(req_ids: Sequence[str], computed: Sequence[int], *,
                    new_blocks: Sequence[BlockIds | None] | None = None, resumed: Iterable[str] = (),
                    all_tokens: Mapping[str, list[int]] | None = None) -> CachedRequestData:
    """Requests scheduled before; ``computed`` is each one's ``num_computed_tokens``."""
    return CachedRequestData(
        req_ids=list(req_ids), resumed_req_ids=set(resumed), new_token_ids=[[] for _ in req_ids],
        all_token_ids=dict(all_tokens or {}),
        new_block_ids=list(new_blocks) if new_blocks is not None else [None] * len(req_ids),
        num_computed_tokens=list(computed), num_output_tokens=[0] * len(req_ids),
    )


def scheduler_output(new: Sequence[NewRequestData] = (), cached: CachedRequestData | None = None,
                     scheduled: Mapping[str, int] | None = None, finished: Iterable[str] = (),
                     preempted: Iterable[str] | None = None) -> SchedulerOutput:
    """One step; ``scheduled`` maps each scheduled request to its token count, in row order."""
    scheduled = dict(scheduled or {})
    return SchedulerOutput(
        scheduled_new_reqs=list(new), scheduled_cached_reqs=cached or cached_requests([], []),
        num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, num_common_prefix_blocks=[],
        finished_req_ids=set(finished), free_encoder_mm_hashes=[],
        preempted_req_ids=set(preempted) if preempted is not None else None,
    )
