"""``DraftVerifier``: vLLM's rejection sampler (with the host kernel bodies) over verify-step logits."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import torch
from vllm import SamplingParams
from vllm_tt_sampling.host import HostSamplingBatch, SeedStream
from vllm_tt_sampling.host.speculative import DraftVerifier, spec_decode_metadata

VOCAB = 64


def batch(*params: SamplingParams, seed_stream: SeedStream = SeedStream.GENERATOR,
          outputs: list[list[int]] | None = None) -> HostSamplingBatch:
    config = SimpleNamespace(  # the parts of VllmConfig the host sampler reads (test_host_batch.py)
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        model_config=SimpleNamespace(logits_processors=None, logprobs_mode="raw_logprobs"),
        speculative_config=None,
    )
    b = HostSamplingBatch(4, VOCAB, config, seed_stream=seed_stream)
    for slot, p in enumerate(params):
        b.add_request(slot, f"r{slot}", p, [1], outputs[slot] if outputs else [], None)
    return b


def three_token_target() -> torch.Tensor:
    """Log-probabilities 0.5, 0.3, 0.2 on tokens 4, 5, 6 (the rest ~0)."""
    target = torch.full((VOCAB,), -30.0)
    target[[4, 5, 6]] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    return target


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
    logits = three_token_target().expand(1, 4, VOCAB).clone()
    torch.manual_seed(0)
    counts = Counter(verifier.verify(logits, [0], [[5, 5, 5]])[0][0] for _ in range(3000))
    assert set(counts) <= {4, 5, 6}
    for token, p in ((4, 0.5), (5, 0.3), (6, 0.2)):
        assert abs(counts[token] / 3000 - p) < 0.035, counts


def plain_decode(b: HostSamplingBatch, logits: torch.Tensor, slot: int, steps: int) -> list[int]:
    """What plain decode steps draw for ``slot``, one token a step, each appended to its output
    (``logits[j]``: the distribution after ``j`` of them)."""
    output = b._require(slot).output_token_ids
    drawn = []
    for j in range(steps):
        drawn.append(int(b.sample(logits[j : j + 1], [slot]).sampled_token_ids[0, 0]))
        output.append(drawn[-1])
    del output[len(output) - steps :]
    return drawn


def test_seeded_rows_keep_the_tokens_of_plain_decoding_whatever_the_drafts() -> None:
    """Counter stream (the runner's): a seeded row's tokens are its plain-decode draws at each
    position; drafts equal to them stand, the first that differs is replaced by the draw. Its
    unseeded neighbour still goes through vLLM's rejection sampler."""
    seeded = SamplingParams(temperature=1.0, seed=11)
    b = batch(seeded, SamplingParams(temperature=1.0), seeded, outputs=[[7, 8], [], [9]],
              seed_stream=SeedStream.COUNTER)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    for slot in (0, 2):
        plain = plain_decode(b, logits, slot, 4)
        verifier = DraftVerifier(b)
        rows = logits.expand(3, 4, VOCAB).clone()
        wrong = (plain[1] + 1) % VOCAB
        for drafts, expected in (
            (plain[:3], plain),  # every draft equals the draw: all kept, plus the draw after them
            ([plain[0], wrong, plain[2]], plain[:2]),  # the second differs: the draw replaces it
            ([], plain[:1]),  # no drafts: the token of a plain decode step
        ):
            out = verifier.verify(rows, [slot, 1, 2 - slot], [drafts, [4, 4], []])
            assert out[0] == expected, (slot, drafts)
            assert 1 <= len(out[1]) <= 3 and len(out[2]) == 1


def test_seeded_rows_keep_the_target_distribution_and_accept_with_its_probability() -> None:
    """Over many seeds, a seeded row's first token follows the target, and a draft is kept as
    often as the target draws it (0.3 for token 5), as vLLM's rejection sampler would."""
    logits = three_token_target().expand(1, 4, VOCAB).clone()
    counts: Counter[int] = Counter()
    kept = 0
    runs = 3000
    b = batch(seed_stream=SeedStream.COUNTER)
    verifier = DraftVerifier(b)
    for seed in range(runs):
        b.add_request(0, "r", SamplingParams(temperature=1.0, seed=seed), [1], [], None)
        tokens = verifier.verify(logits, [0], [[5, 5, 5]])[0]
        b.remove_request(0)
        counts[tokens[0]] += 1
        kept += len(tokens) - 1
    assert set(counts) <= {4, 5, 6}
    for token, p in ((4, 0.5), (5, 0.3), (6, 0.2)):
        assert abs(counts[token] / runs - p) < 0.035, counts
    # kept drafts per row: 0.3 + 0.3^2 + 0.3^3 = 0.417 in expectation
    assert abs(kept / runs - 0.417) < 0.05, kept
