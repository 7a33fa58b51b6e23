"""The step that ends a device-sampled program: the host reference of tt-metal's sampler, and
the output form the runner expects from it."""

from __future__ import annotations

from typing import Any

import torch


def plain_greedy(params: Any) -> bool:
    """Device sampling that is an argmax of the raw logits: greedy, no penalties, no logprobs."""
    return (params is not None and all(t < 1e-5 for t in params.temperature)
            and not params.has_penalties and not any(params.enable_log_probs))


def device_sample(logits: torch.Tensor, params: Any, last_input: torch.Tensor, prompt_tokens: Any,
                  output_tokens: Any) -> Any:
    """Device sampling: tokens ``[B]``, or ``(tokens, logprobs)`` when any row asks for logprobs
    (the runner requires the tuple then). Seeded draws are keyed by each row's last input
    position, as the sampler documents."""
    from vllm_tt_sampling.device import sample_tokens

    result = sample_tokens(
        logits, params, last_input.long(),
        None if prompt_tokens is None else torch.as_tensor(prompt_tokens),
        None if output_tokens is None else torch.as_tensor(output_tokens),
    )
    if any(params.enable_log_probs):
        return result.tokens, result.logprobs
    return result.tokens
