"""``method: custom_class`` naming ``ModelDrafts``: the served model drafts for itself (the
reference plugin's ``custom_class`` rail, the contract's ``max_model_drafts``).

After each step the runner asks the model's ``propose_drafts`` for up to K drafts per row after
the row's newest token; vLLM's scheduler stores them and the next step verifies them like any
other drafts (fixed-shape verify steps, vLLM's rejection sampler or the device's argmax). The
drafter is the model's own program over the target's KV cache: it needs no KV pages of its own,
only K lookahead slots per row (the phase scheduler reserves them), and a row whose drafts keep
missing drafts less (``drafters.DraftBackoff``).

vLLM instantiates a ``custom_class`` proposer itself on GPUs; on TT the runner builds this one,
and this module's path is what ``--speculative-config`` names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from vllm.config import VllmConfig

from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.call_builder import StepCalls
from vllm_tt_platform.runner.drafters import DraftBackoff


class ModelDrafts:
    """The model's ``propose_drafts`` as the runner's ``Drafter``."""

    def __init__(self, vllm_config: VllmConfig, model: Any, num_tokens: int, calls: Callable[[], StepCalls]) -> None:
        self.model = model
        self.num_tokens = num_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self._calls = calls
        """The current step's call builder (KV cache, block tables), read at each proposal."""
        self.backoff = DraftBackoff()

    def describe(self) -> str:
        return f"drafted by the model itself ({type(self.model).__qualname__}.propose_drafts) over its own KV cache"

    def propose(self, states: list[RequestState]) -> list[list[int]]:
        rows = []
        for state in states:
            # Drafts at num_tokens - 1 .. and the verify step after them must fit the model length.
            k = min(self.backoff.drafts_for(state.req_id, self.num_tokens), self.max_model_len - state.num_tokens)
            if k > 0:
                rows.append((state, k))
        if not rows:
            return [[] for _ in states]
        drafts = torch.as_tensor(self.model.propose_drafts(**self._calls().drafts(rows).to_contract_kwargs()))
        out = {state.req_id: [int(t) for t in drafts[state.slot, :k].tolist() if t >= 0] for state, k in rows}
        return [out.get(s.req_id, []) for s in states]

    def forget(self, req_ids: Iterable[str]) -> None:
        self.backoff.forget(req_ids)

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        self.backoff.verified(req_id, drafted, accepted)
