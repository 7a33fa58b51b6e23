"""What a model that samples on device is sent: wire parameters and, when any row has
penalties, the -1-padded prompt and output token histories they are computed from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm_tt_sampling.params import TTSamplingParams
from vllm_tt_sampling.wire import to_device_params

from vllm_tt_platform.runner.batch import RequestState


@dataclass(frozen=True)
class DeviceSampling:
    """The sampling part of a device-sampled call, one wire row per call row."""

    params: TTSamplingParams
    prompt_tokens: torch.Tensor | None = None
    """int32 ``[rows, L]`` prompt histories, -1-padded; only when a row has penalties."""
    output_tokens: torch.Tensor | None = None
    """int32 ``[rows, L]`` output histories, -1-padded; only when a row has penalties."""

    @classmethod
    def of(cls, states: Sequence[RequestState | None], vocab_size: int) -> DeviceSampling:
        """One wire row per entry (None = padding). Sending the histories in prefill too matters
        for a resumed request: its earlier outputs count as output, not as prompt."""
        params = to_device_params([s.sampling_params if s is not None else None for s in states], vocab_size)
        if not params.has_penalties:
            return cls(params)
        return cls(params, _padded([s.prompt_token_ids if s else [] for s in states]),
                   _padded([s.output_token_ids if s else [] for s in states]))

    @property
    def penalties(self) -> bool:
        return self.prompt_tokens is not None

    @property
    def logprobs(self) -> bool:
        """Whether any row asked the device for logprobs."""
        return any(self.params.enable_log_probs)

    def to_contract_kwargs(self) -> dict[str, Any]:
        """``sampling_params``, plus ``prompt_tokens`` / ``output_tokens`` with penalties."""
        kwargs: dict[str, Any] = {"sampling_params": self.params}
        if self.prompt_tokens is not None:
            kwargs["prompt_tokens"] = self.prompt_tokens
            kwargs["output_tokens"] = self.output_tokens
        return kwargs


def _padded(histories: list[list[int]]) -> torch.Tensor:
    width = max(1, max(len(h) for h in histories))
    out = torch.full((len(histories), width), -1, dtype=torch.int32)
    for i, tokens in enumerate(histories):
        if tokens:
            out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    return out
