"""``PortableSampler``: vLLM's ``Sampler`` with its platform-dispatched kernels pinned to torch.

vLLM picks kernels by platform: on a CPU platform greedy argmax and the top-k/top-p draw call
``torch.ops._C`` (absent without vLLM's compiled CPU extension), and logprob ranks go through a
``torch.compile``-d helper. A TT host runs vLLM's sampler on host tensors under an out-of-tree
platform, so all three are replaced by their plain-torch equivalents. Everything else (penalties,
bad words, allowed tokens, logits processors, temperature, top-k/top-p, logprob gathering) is
vLLM's own code. Tombstone tests in ``tests/test_compat.py`` fail once this can be deleted.
"""

from __future__ import annotations

import torch
from vllm.config.model import LogprobsMode
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.sampler import Sampler

from vllm_tt_sampling.host.logprobs import gather_logprobs, token_ranks


class PortableSampler(Sampler):
    def __init__(self, logprobs_mode: LogprobsMode = "raw_logprobs") -> None:
        super().__init__(logprobs_mode=logprobs_mode)
        self.topk_topp_sampler.forward = self.topk_topp_sampler.forward_native

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
