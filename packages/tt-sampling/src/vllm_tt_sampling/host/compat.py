"""``PortableSampler``: vLLM's ``Sampler`` with its platform-dispatched kernels pinned to torch.

vLLM picks kernels by platform: on a CPU platform greedy argmax and the top-k/top-p draw call
``torch.ops._C`` (absent without vLLM's compiled CPU extension), and logprob ranks go through a
``torch.compile``-d helper. A TT host runs vLLM's sampler on host tensors under an out-of-tree
platform, so all three are replaced by their plain-torch equivalents. Everything else (penalties,
bad words, allowed tokens, logits processors, temperature, top-k/top-p, logprob gathering) is
vLLM's own code. Tombstone tests in ``tests/test_compat.py`` fail once this can be deleted.

``sample_counter`` is not a workaround but the counter seed stream: rows given a uniform skip
vLLM's exponential-noise draw and take ``device.draw.inverse_cdf_draw`` on the same scores
vLLM's top-k/top-p would see (after penalties, temperature and min_p), exactly as the device
reference draws.
"""

from __future__ import annotations

import torch
from vllm.config.model import LogprobsMode
from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

from vllm_tt_sampling.device.draw import inverse_cdf_draw
from vllm_tt_sampling.host.logprobs import gather_logprobs, token_ranks


class PortableSampler(Sampler):
    def __init__(self, logprobs_mode: LogprobsMode = "raw_logprobs") -> None:
        super().__init__(logprobs_mode=logprobs_mode)
        self._native = self.topk_topp_sampler.forward_native
        self.topk_topp_sampler.forward = self._top_k_top_p
        self._uniforms: dict[int, float] = {}

    def sample_counter(
        self, logits: torch.Tensor, metadata: SamplingMetadata, uniforms: dict[int, float]
    ) -> SamplerOutput:
        """vLLM's sampler, except that each row in ``uniforms`` (row -> uniform in [0, 1), for
        stochastic rows only) is drawn by inverse CDF with that uniform."""
        self._uniforms = uniforms
        try:
            return self(logits, metadata)
        finally:
            self._uniforms = {}

    def _top_k_top_p(
        self,
        logits: torch.Tensor,
        generators: dict[int, torch.Generator],
        k: torch.Tensor | None,
        p: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self._uniforms:
            return self._native(logits, generators, k, p)
        rows = torch.tensor(sorted(self._uniforms), dtype=torch.int64)
        scaled = logits[rows]  # a copy: the native path below edits logits in place
        sampled, processed = self._native(logits, generators, k, p)
        vocab_size = logits.shape[1]
        top_k = torch.full((len(rows),), vocab_size, dtype=torch.int64) if k is None else k[rows].long()
        sampled[rows] = inverse_cdf_draw(
            scaled,
            top_k=top_k.clamp(1, vocab_size),
            top_p=torch.ones(len(rows)) if p is None else p[rows].float(),
            uniforms=torch.tensor([self._uniforms[int(r)] for r in rows], dtype=torch.float64),
        ).to(sampled.dtype)
        return sampled, processed

    @staticmethod
    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1).view(-1)

    @staticmethod
    def gather_logprobs(
        logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
    ) -> LogprobsTensors:
        return gather_logprobs(logprobs, num_logprobs, token_ids)

    def gather_specific_token_logprobs(
        self,
        logprobs: torch.Tensor,
        logprob_token_ids: dict[int, list[int]],
        sampled: torch.Tensor,
    ) -> LogprobsTensors | None:
        """Column 0 = sampled token, then each row's requested ids; padding is -inf."""
        if not logprob_token_ids:
            return None
        rows = logprobs.shape[0]
        width = 1 + max(len(ids) for ids in logprob_token_ids.values())
        token_ids = torch.zeros((rows, width), dtype=torch.int64)
        valid = torch.zeros((rows, width), dtype=torch.bool)
        token_ids[:, 0] = sampled
        valid[:, 0] = True
        for row, ids in logprob_token_ids.items():
            token_ids[row, 1 : 1 + len(ids)] = torch.as_tensor(ids, dtype=torch.int64)
            valid[row, 1 : 1 + len(ids)] = True
        gathered = logprobs.gather(-1, token_ids).masked_fill(~valid, float("-inf"))
        picked = logprobs.gather(-1, sampled.unsqueeze(-1))
        return LogprobsTensors(
            logprob_token_ids=token_ids.to(torch.int32),
            logprobs=gathered,
            selected_token_ranks=token_ranks(logprobs, picked),
        )
