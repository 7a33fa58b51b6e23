"""What a model that samples on device is sent: wire parameters and, when any row has
penalties, the -1-padded prompt and output token histories they are computed from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from vllm_tt_sampling.wire import to_device_params

from vllm_tt_platform.runner.batch import RequestState


def device_sampling_kwargs(states: Sequence[RequestState | None], vocab_size: int) -> dict[str, Any]:
    """``sampling_params`` (one wire row per entry, None = padding) plus ``prompt_tokens`` /
    ``output_tokens`` ``[rows, L]`` when penalties are on. Sending the histories in prefill
    too matters for a resumed request: its earlier outputs count as output, not as prompt."""
    params = to_device_params([s.sampling_params if s is not None else None for s in states], vocab_size)
    kwargs: dict[str, Any] = {"sampling_params": params}
    if params.has_penalties:
        kwargs["prompt_tokens"] = _padded([s.prompt_token_ids if s else [] for s in states])
        kwargs["output_tokens"] = _padded([s.output_token_ids if s else [] for s in states])
    return kwargs


def _padded(histories: list[list[int]]) -> torch.Tensor:
    width = max(1, max(len(h) for h in histories))
    out = torch.full((len(histories), width), -1, dtype=torch.int32)
    for i, tokens in enumerate(histories):
        if tokens:
            out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    return out
