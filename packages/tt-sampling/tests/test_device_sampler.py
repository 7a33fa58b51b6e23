"""Host reference of device sampling: greedy, top-k/top-p support, seeded draws, penalties,
logprobs."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm_tt_sampling.device import DeviceSample, sample_tokens
from vllm_tt_sampling.device.penalties import penalise_rows
from vllm_tt_sampling.device.rng import seeded_uniform, splitmix64
from vllm_tt_sampling.params import TTSamplingParams

VOCAB = 64


def params(rows: int, **columns) -> TTSamplingParams:
    """Neutral rows with the given columns replaced (each a full list)."""
    return dataclasses.replace(TTSamplingParams.neutral(rows), **columns)


def sampling(rows: int, temperature=1.0, top_k=32, top_p=1.0, seed=None) -> TTSamplingParams:
    return params(
        rows,
        temperature=[temperature] * rows,
        top_k=[top_k] * rows,
        top_p=[top_p] * rows,
        seed=[seed] * rows,
    )


def logits_from_probs(probs: list[float]) -> torch.Tensor:
    p = torch.full((VOCAB,), 1e-9)
    p[: len(probs)] = torch.tensor(probs)
    return p.log()


# --- rng -----------------------------------------------------------------------------------------


def test_splitmix64_matches_reference_outputs():
    # First outputs of the reference SplitMix64 generator (Vigna) for seeds 0 and 1234567.
    assert [splitmix64(0, n) for n in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]
    assert splitmix64(1234567, 0) == 6457827717110365317


def test_seeded_uniform_is_a_pure_function_in_unit_interval():
    values = [seeded_uniform(-3, p) for p in range(1000)]
    assert values == [seeded_uniform(-3, p) for p in range(1000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert 0.45 < sum(values) / len(values) < 0.55
    assert seeded_uniform(1, 5) != seeded_uniform(2, 5)


# --- greedy --------------------------------------------------------------------------------------


def test_greedy_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(5, VOCAB)
    out = sample_tokens(logits, TTSamplingParams.neutral(5), torch.arange(5))
    assert isinstance(out, DeviceSample)
    assert out.tokens.dtype == torch.int64
    assert torch.equal(out.tokens, logits.argmax(dim=-1))
    assert out.logprobs is None


def test_top_k_one_is_argmax_even_when_stochastic():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    out = sample_tokens(logits, sampling(3, top_k=1, seed=9), torch.arange(3))
    assert torch.equal(out.tokens, logits.argmax(dim=-1))


def test_caller_logits_are_not_modified():
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    p = dataclasses.replace(sampling(2), repetition_penalty=[2.0, 2.0])
    sample_tokens(logits, p, torch.zeros(2), output_tokens=torch.tensor([[1], [2]]))
    assert torch.equal(logits, before)


# --- top-k / top-p (statistical, fixed generator) -----------------------------------------------


def draw_many(logits_row: torch.Tensor, p: TTSamplingParams, n: int = 4000) -> Counter:
    gen = torch.Generator().manual_seed(1234)
    rows = logits_row.expand(n, -1)
    wide = dataclasses.replace(p, **{f: getattr(p, f) * n for f in vars(p)})
    out = sample_tokens(rows, wide, torch.zeros(n, dtype=torch.int64), generator=gen)
    return Counter(out.tokens.tolist())


def test_top_k_restricts_support_and_keeps_proportions():
    logits = logits_from_probs([0.3, 0.25, 0.2, 0.15, 0.1])
    counts = draw_many(logits, sampling(1, top_k=3))
    assert set(counts) == {0, 1, 2}
    total = sum(counts.values())
    for token, expected in {0: 0.3 / 0.75, 1: 0.25 / 0.75, 2: 0.2 / 0.75}.items():
        assert abs(counts[token] / total - expected) < 0.03


def test_top_p_keeps_smallest_prefix_reaching_p():
    logits = logits_from_probs([0.5, 0.3, 0.1, 0.1])
    assert set(draw_many(logits, sampling(1, top_p=0.7))) == {0, 1}
    assert set(draw_many(logits, sampling(1, top_p=0.85))) == {0, 1, 2}


def test_top_p_zero_keeps_best_candidate():
    logits = logits_from_probs([0.4, 0.35, 0.25])
    assert set(draw_many(logits, sampling(1, top_p=0.0), n=200)) == {0}


def test_top_p_applies_after_top_k():
    # Over the top-2 (renormalised 0.625 / 0.375) a top_p of 0.6 keeps only token 0; over the
    # whole distribution it would keep tokens 0 and 1 (mass before token 1 is 0.5 < 0.6).
    logits = logits_from_probs([0.5, 0.3, 0.2])
    assert set(draw_many(logits, sampling(1, top_k=2, top_p=0.6))) == {0}


def test_temperature_flattens_distribution():
    logits = logits_from_probs([0.9, 0.1])
    cold = draw_many(logits, sampling(1, temperature=0.5, top_k=2))
    hot = draw_many(logits, sampling(1, temperature=4.0, top_k=2))
    assert hot[1] > 2 * cold[1]


@pytest.mark.parametrize("top_k", [0, -1, 100, VOCAB])
def test_top_k_is_capped_like_the_device(top_k):
    # Uniform logits: any of the 64 tokens is equally likely, but the device looks at 32 at most.
    logits = torch.zeros(VOCAB)
    logits[:32] += 1e-3  # a well-defined top-32
    counts = draw_many(logits, sampling(1, top_k=top_k))
    assert set(counts) == set(range(32))


def test_max_top_k_is_configurable():
    logits = torch.zeros(1, VOCAB)
    logits[0, :8] = torch.linspace(1.0, 0.9, 8)
    out = sample_tokens(
        logits.expand(500, -1),
        sampling(500, top_k=0),
        torch.arange(500),
        max_top_k=4,
        generator=torch.Generator().manual_seed(0),
    )
    assert set(out.tokens.tolist()) == {0, 1, 2, 3}


def test_unseeded_rows_vary():
    logits = torch.zeros(1, VOCAB)
    first = sample_tokens(logits.expand(50, -1), sampling(50), torch.zeros(50))
    second = sample_tokens(logits.expand(50, -1), sampling(50), torch.zeros(50))
    assert not torch.equal(first.tokens, second.tokens)


# --- seeded rows ---------------------------------------------------------------------------------


def run_seeded(rows_logits, seeds, positions):
    n = len(seeds)
    p = dataclasses.replace(sampling(n), seed=list(seeds))
    return sample_tokens(torch.stack(rows_logits), p, torch.tensor(positions)).tokens.tolist()


def test_seeded_row_is_independent_of_neighbours_and_slot():
    torch.manual_seed(3)
    mine = torch.randn(VOCAB)
    others = [torch.randn(VOCAB) for _ in range(4)]
    for position in range(20):
        alone = run_seeded([mine], [42], [position])[0]
        batch = [*others[:3], mine, others[3]]
        in_slot_3 = run_seeded(batch, [None, 7, None, 42, 1], [0, 5, 9, position, 2])[3]
        assert alone == in_slot_3


def test_seeded_stream_replays_after_preemption():
    # Same seed, same logits, same positions -> same tokens, however the steps were grouped.
    torch.manual_seed(4)
    logits = torch.randn(10, VOCAB)
    first = [run_seeded([logits[i]], [11], [100 + i])[0] for i in range(10)]
    replay = run_seeded(list(logits), [11] * 10, list(range(100, 110)))
    assert first == replay


def test_seed_and_position_both_matter():
    logits = torch.zeros(VOCAB)
    by_position = {run_seeded([logits], [5], [p])[0] for p in range(40)}
    by_seed = {run_seeded([logits], [s], [0])[0] for s in range(40)}
    assert len(by_position) > 10 and len(by_seed) > 10


def test_seeded_draws_follow_the_distribution():
    logits = logits_from_probs([0.6, 0.3, 0.1])
    tokens = run_seeded([logits] * 3000, [77] * 3000, list(range(3000)))
    counts = Counter(tokens)
    assert set(counts) == {0, 1, 2}
    assert abs(counts[0] / 3000 - 0.6) < 0.03
    assert abs(counts[2] / 3000 - 0.1) < 0.02


# --- penalties -----------------------------------------------------------------------------------


def test_penalties_match_vllm():
    torch.manual_seed(5)
    logits = torch.randn(3, VOCAB) * 3
    prompts = [[1, 2, 3, 3], [4], []]
    outputs = [[3, 3, 5, 9], [4, 4, 4], [7]]
    presence, frequency, repetition = [0.5, -0.3, 1.0], [0.2, 0.7, -0.4], [1.3, 0.8, 2.0]

    def padded(histories, pad):
        width = max(len(h) for h in histories)
        return torch.tensor([h + [pad] * (width - len(h)) for h in histories])

    expected = apply_all_penalties(
        logits.clone(),
        padded(prompts, VOCAB),
        torch.tensor(presence),
        torch.tensor(frequency),
        torch.tensor(repetition),
        outputs,
    )
    p = dataclasses.replace(
        TTSamplingParams.neutral(3),
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        enable_log_probs=[True] * 3,
    )
    out = sample_tokens(logits, p, torch.zeros(3), padded(prompts, -1), padded(outputs, -1))
    assert torch.equal(out.tokens, expected.argmax(dim=-1))
    # Bit-identical, not just close: seeded draws must not depend on the sampling path.
    assert torch.equal(penalise_rows(logits, p, padded(prompts, -1), padded(outputs, -1)), expected)
    # Logprobs stay raw (vLLM's default logprobs_mode): penalties do not change them.
    torch.testing.assert_close(
        out.logprobs, logits.log_softmax(-1).gather(1, out.tokens[:, None]).squeeze(1)
    )


def test_repetition_penalty_changes_greedy_choice():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    p = dataclasses.replace(TTSamplingParams.neutral(1), repetition_penalty=[2.0])
    assert sample_tokens(logits, p, torch.zeros(1)).tokens.item() == 3
    out = sample_tokens(logits, p, torch.zeros(1), prompt_tokens=torch.tensor([[3, -1]]))
    assert out.tokens.item() == 4


def test_zero_repetition_penalty_counts_as_neutral():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 2.0
    p = dataclasses.replace(TTSamplingParams.neutral(1), repetition_penalty=[0.0], presence_penalty=[0.0001])
    out = sample_tokens(logits, p, torch.zeros(1), output_tokens=torch.tensor([[3]]))
    assert out.tokens.item() == 3


def test_penalties_reject_out_of_vocab_history():
    p = dataclasses.replace(TTSamplingParams.neutral(1), presence_penalty=[1.0])
    with pytest.raises(ValueError, match="outside"):
        sample_tokens(torch.zeros(1, VOCAB), p, torch.zeros(1), output_tokens=torch.tensor([[VOCAB]]))


# --- logprobs ------------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_of_sampled_token():
    torch.manual_seed(6)
    logits = torch.randn(4, VOCAB)
    p = dataclasses.replace(
        sampling(4, temperature=0.7, top_k=5, seed=3), enable_log_probs=[True, False, True, False]
    )
    out = sample_tokens(logits, p, torch.arange(4))
    assert out.logprobs is not None and out.logprobs.dtype == torch.float32
    expected = logits.log_softmax(-1).gather(1, out.tokens[:, None]).squeeze(1)
    torch.testing.assert_close(out.logprobs[[0, 2]], expected[[0, 2]])
    assert out.logprobs[[1, 3]].isnan().all()  # rows that did not ask


# --- input checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("logits", "p", "positions", "match"),
    [
        (torch.zeros(VOCAB), TTSamplingParams.neutral(1), torch.zeros(1), "batch, vocab"),
        (torch.zeros(2, VOCAB), TTSamplingParams.neutral(1), torch.zeros(2), "params has 1"),
        (torch.zeros(2, VOCAB), TTSamplingParams.neutral(2), torch.zeros(3), "positions"),
    ],
)
def test_bad_inputs_raise(logits, p, positions, match):
    with pytest.raises(ValueError, match=match):
        sample_tokens(logits, p, positions)
