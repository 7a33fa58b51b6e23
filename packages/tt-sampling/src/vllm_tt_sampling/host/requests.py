"""``SlotRequest``: what the host sampler keeps for the request living in one slot."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm import SamplingParams

_SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class SlotRequest:
    req_id: str
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    """The runner's live list: it appends each sampled token, penalties read it in place."""
    generator: torch.Generator | None
    banned: torch.Tensor | None
    """``[vocab]`` bool, True for tokens outside ``allowed_token_ids``; None if unrestricted."""

    @classmethod
    def create(
        cls,
        req_id: str,
        params: SamplingParams,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        generator: torch.Generator | None,
        vocab_size: int,
    ) -> SlotRequest:
        if params.bad_words and params.bad_words_token_ids is None:
            raise ValueError(
                f"request {req_id!r} has bad_words but no bad_words_token_ids: vLLM tokenises "
                "them when the request is processed; a runner must pass processed params."
            )
        banned = None
        if params.allowed_token_ids:
            ids = list(params.allowed_token_ids)
            if min(ids) < 0 or max(ids) >= vocab_size:
                raise ValueError(f"request {req_id!r}: allowed_token_ids must lie in [0, {vocab_size}).")
            banned = torch.ones(vocab_size, dtype=torch.bool)
            banned[ids] = False
        return cls(req_id, params, prompt_token_ids, output_token_ids, generator, banned)

    @property
    def greedy(self) -> bool:
        return self.params.temperature < _SAMPLING_EPS

    @property
    def penalised(self) -> bool:
        p = self.params
        return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or (p.repetition_penalty != 1.0)
