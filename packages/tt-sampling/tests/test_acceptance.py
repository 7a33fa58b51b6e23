"""``accept_greedy`` (device-side verification of greedy rows) is vLLM's rejection sampler for
greedy rows: on random verify steps it returns exactly what ``DraftVerifier`` (vLLM's
``RejectionSampler`` over the logits) returns, from the argmax tokens alone."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm_tt_sampling.acceptance import accept_greedy
from vllm_tt_sampling.host import HostSamplingBatch
from vllm_tt_sampling.host.speculative import DraftVerifier

K = 3
VOCAB = 64
ROWS = 4


def greedy_verifier() -> DraftVerifier:
    config = SimpleNamespace(  # the parts of VllmConfig the host sampler reads (test_host_batch.py)
        scheduler_config=SimpleNamespace(max_num_seqs=ROWS),
        model_config=SimpleNamespace(logits_processors=None, logprobs_mode="raw_logprobs"),
        speculative_config=None,
    )
    batch = HostSamplingBatch(ROWS, VOCAB, config)
    for slot in range(ROWS):
        batch.add_request(slot, f"r{slot}", SamplingParams(temperature=0.0), [1], [], None)
    return DraftVerifier(batch)


def test_keeps_the_matching_prefix_then_the_target_token():
    targets = [[5, 6, 7, 8], [5, 9, 7, 8], [3, 1, 1, 1], [4, 4, 4, 4]]
    assert accept_greedy(targets, [[5, 6, 7], [5, 6, 7], [], [9]]) == [[5, 6, 7, 8], [5, 9], [3], [4]]


def test_equals_vllms_rejection_sampler_on_random_verify_steps():
    rng = random.Random(0)
    torch.manual_seed(0)
    verifier = greedy_verifier()
    kept = 0
    for _ in range(200):
        logits = torch.randn(4, 1 + K, VOCAB)
        targets = logits.argmax(dim=-1)
        drafts = []
        for i in range(4):  # drafts that follow the target for a random stretch, then guess
            n, hits = rng.randint(0, K), rng.randint(0, K)
            drafts.append([int(targets[i, j]) if j < hits else rng.randrange(VOCAB) for j in range(n)])
        expected = verifier.verify(logits, [0, 1, 2, 3], drafts)
        assert accept_greedy(targets.tolist(), drafts) == expected, drafts
        kept += sum(len(t) - 1 for t in expected)
    assert kept > 200  # many drafts were accepted, not only rejected


def test_a_row_needs_a_target_token_past_its_drafts():
    with pytest.raises(ValueError, match="row 0 has 3 drafts but only 3 target tokens"):
        accept_greedy([[1, 2, 3]], [[1, 2, 3]])
