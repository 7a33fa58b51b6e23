"""``SamplingMetadata`` for the rows of one host sampling call, as vLLM's input batch builds it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

from vllm_tt_sampling.host.requests import SlotRequest


def build_metadata(
    requests: Sequence[SlotRequest], vocab_size: int, logitsprocs: LogitsProcessors,
    thinking_budget: ThinkingBudgetStateHolder | None = None,
) -> SamplingMetadata:
    """Row i of the call samples ``requests[i]``. Only the rows' own generators are passed, so
    slots that do not sample in this call keep their random state. ``thinking_budget``: vLLM's
    thinking-budget state over the slots (``thinking_budget.SlotThinkingBudget``), or None."""
    greedy = [r.greedy for r in requests]
    params = [r.params for r in requests]
    all_greedy = all(greedy)
    top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
    use_top_k = any(k < vocab_size for k, g in zip(top_k, greedy, strict=True) if not g)
    use_top_p = any(p.top_p < 1.0 for p, g in zip(params, greedy, strict=True) if not g)
    logprobs = [vocab_size if p.logprobs == -1 else p.logprobs for p in params]
    asked = [n for n in logprobs if n is not None]
    no_penalties = not any(r.penalised for r in requests)
    # getattr: logprob_token_ids is recent; older vLLM releases of the support window may lack it.
    token_ids = {i: list(ids) for i, p in enumerate(params) if (ids := getattr(p, "logprob_token_ids", None))}
    return SamplingMetadata(
        temperature=None
        if all_greedy
        else torch.tensor(
            [0.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)],
            dtype=torch.float32,
        ),
        all_greedy=all_greedy,
        all_random=not any(greedy),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32) if use_top_p else None,
        top_k=torch.tensor(top_k, dtype=torch.int32) if use_top_k else None,
        generators={
            i: r.generator for i, r in enumerate(requests) if r.generator is not None and not r.greedy
        },
        max_num_logprobs=max(asked) if asked else None,
        no_penalties=no_penalties,
        prompt_token_ids=None if no_penalties else _padded_prompts(requests, vocab_size),
        frequency_penalties=torch.tensor([p.frequency_penalty for p in params]),
        presence_penalties=torch.tensor([p.presence_penalty for p in params]),
        repetition_penalties=torch.tensor([p.repetition_penalty for p in params]),
        output_token_ids=[r.output_token_ids for r in requests],
        allowed_token_ids_mask=_banned(requests, vocab_size),
        bad_words_token_ids={i: p.bad_words_token_ids for i, p in enumerate(params) if p.bad_words_token_ids},
        logitsprocs=logitsprocs,
        logprob_token_ids=token_ids or None,
        thinking_budget_state_holder=thinking_budget,
    )


def _padded_prompts(requests: Sequence[SlotRequest], vocab_size: int) -> torch.Tensor:
    # vLLM pads prompt histories with vocab_size, an id no token has.
    width = max(len(r.prompt_token_ids) for r in requests)
    prompts = torch.full((len(requests), width), vocab_size, dtype=torch.int64)
    for i, r in enumerate(requests):
        prompts[i, : len(r.prompt_token_ids)] = torch.as_tensor(r.prompt_token_ids)
    return prompts


def _banned(requests: Sequence[SlotRequest], vocab_size: int) -> torch.Tensor | None:
    if all(r.banned is None for r in requests):
        return None
    mask = torch.zeros((len(requests), vocab_size), dtype=torch.bool)
    for i, r in enumerate(requests):
        if r.banned is not None:
            mask[i] = r.banned
    return mask
