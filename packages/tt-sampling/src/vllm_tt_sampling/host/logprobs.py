"""Logprob tensors in vLLM's ``LogprobsTensors`` format, computed eagerly.

vLLM ranks tokens with a ``torch.compile``-d helper whose backend comes from the current platform;
on a TT host that compile is neither needed nor guaranteed to work, so ranks are counted here.
"""

from __future__ import annotations

import torch
from vllm.v1.outputs import LogprobsTensors


def token_ranks(logprobs: torch.Tensor, token_logprobs: torch.Tensor) -> torch.Tensor:
    """1-based rank of each row's token: entries at least as likely, ``[rows]`` int64."""
    return (logprobs >= token_logprobs).sum(dim=-1)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor) -> LogprobsTensors:
    """Column 0 = the given token, columns 1..n = the top-n, as vLLM's ``Sampler`` returns."""
    top_values, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    token_ids = token_ids.to(torch.int64).unsqueeze(-1)
    picked = logprobs.gather(-1, token_ids)
    return LogprobsTensors(
        logprob_token_ids=torch.cat((token_ids, top_ids), dim=1).to(torch.int32),
        logprobs=torch.cat((picked, top_values), dim=1),
        selected_token_ranks=token_ranks(logprobs, picked),
    )

