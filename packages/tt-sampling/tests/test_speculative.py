"""``DraftVerifier``: vLLM's rejection sampler (with the host kernel bodies) over verify-step logits."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import torch
from vllm import SamplingParams
from vllm_tt_sampling.host import HostSamplingBatch
from vllm_tt_sampling.host.speculative import DraftVerifier, spec_decode_metadata

VOCAB = 64


def batch(*params: SamplingParams) -> HostSamplingBatch:
    config = SimpleNamespace(  # the parts of VllmConfig the host sampler reads (test_host_batch.py)
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        model_config=SimpleNamespace(logits_processors=None, logprobs_mode="raw_logprobs"),
        speculative_config=None,
    )
    b = HostSamplingBatch(4, VOCAB, config)
    for slot, p in enumerate(params):
        b.add_request(slot, f"r{slot}", p, [1], [], None)
    return b


def peaked(token: int) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    row[token] = 10.0
    return row


def verify_logits(*rows: list[int]) -> torch.Tensor:
    """``[len(rows), 4, V]``: position ``j`` of row ``i`` peaks at ``rows[i][j]``."""
    out = torch.zeros(len(rows), 4, VOCAB)
    for i, row in enumerate(rows):
        for j, token in enumerate(row):
            out[i, j] = peaked(token)
    return out


def test_metadata_lays_rows_out_as_vllm_runners_do() -> None:
    meta = spec_decode_metadata([[5, 6], [], [7]])
    assert meta.num_draft_tokens == [2, 0, 1]
    assert meta.target_logits_indices.tolist() == [0, 1, 4]
    assert meta.bonus_logits_indices.tolist() == [2, 3, 5]
    assert meta.cu_num_sampled_tokens.tolist() == [3, 4, 6]


def test_greedy_keeps_the_matching_prefix_then_the_target_token() -> None:
    b = batch(*[SamplingParams(temperature=0.0)] * 3)
    verifier = DraftVerifier(b)
    logits = verify_logits([5, 6, 7, 8], [5, 9, 7, 8], [3, 3, 3, 3])
    out = verifier.verify(logits, [0, 1, 2], [[5, 6, 7], [5, 6, 7], []])
    assert out == [[5, 6, 7, 8], [5, 9], [3]]


def test_sampled_rows_keep_the_target_distribution() -> None:
    """n-gram drafts carry no probabilities: a draft is kept with the target's probability of
    it, else a token is drawn from the rest; the first token's frequencies must match the
    target distribution whatever the draft."""
    b = batch(SamplingParams(temperature=1.0))
    verifier = DraftVerifier(b)
    target = torch.full((VOCAB,), -30.0)
    target[[4, 5, 6]] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    logits = target.expand(1, 4, VOCAB).clone()
    torch.manual_seed(0)
    counts = Counter(verifier.verify(logits, [0], [[5, 5, 5]])[0][0] for _ in range(3000))
    assert set(counts) <= {4, 5, 6}
    for token, p in ((4, 0.5), (5, 0.3), (6, 0.2)):
        assert abs(counts[token] / 3000 - p) < 0.035, counts
