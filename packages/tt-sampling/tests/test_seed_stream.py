"""The counter seed stream: a seeded request draws the same token on the host path as the
device reference does, whatever its batch neighbours ask for."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm_tt_sampling.device import sample_tokens
from vllm_tt_sampling.device.draw import inverse_cdf_draw
from vllm_tt_sampling.host import HostSamplingBatch, SeedStream
from vllm_tt_sampling.wire import to_device_params

VOCAB = 64


def make_vllm_config() -> SimpleNamespace:
    """The ``VllmConfig`` attributes the host sampler reads (see test_host_batch.py)."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        model_config=SimpleNamespace(logits_processors=None, logprobs_mode="raw_logprobs"),
        speculative_config=None,
    )


def counter_batch(num_slots: int = 8) -> HostSamplingBatch:
    return HostSamplingBatch(num_slots, VOCAB, make_vllm_config(), seed_stream=SeedStream.COUNTER)


def padded(histories: list[list[int]]) -> torch.Tensor:
    width = max(1, max(len(h) for h in histories))
    return torch.tensor([h + [-1] * (width - len(h)) for h in histories])


def random_case(rng: random.Random, rows: int):
    params, prompts, outputs = [], [], []
    for _ in range(rows):
        penalised = rng.random() < 0.5
        params.append(SamplingParams(
            temperature=rng.choice([0.0, 0.4, 0.8, 1.0, 1.7]),
            top_k=rng.randint(1, 32),
            top_p=rng.choice([1.0, 0.95, 0.7, 0.3]),
            seed=rng.randrange(-(2**40), 2**40),
            presence_penalty=rng.uniform(-1, 1) if penalised else 0.0,
            frequency_penalty=rng.uniform(-1, 1) if penalised else 0.0,
            repetition_penalty=rng.uniform(0.5, 2.0) if penalised else 1.0,
            max_tokens=100,
        ))
        prompts.append([rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))])
        outputs.append([rng.randrange(VOCAB) for _ in range(rng.randint(0, 12))])
    return params, prompts, outputs


@pytest.mark.parametrize("case", range(8))
def test_host_counter_draws_equal_the_device_reference(case):
    rng = random.Random(case)
    rows = 6
    params, prompts, outputs = random_case(rng, rows)
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(case)) * 3
    positions = [len(p) + len(o) - 1 for p, o in zip(prompts, outputs, strict=True)]

    device = sample_tokens(logits, to_device_params(params, VOCAB), torch.tensor(positions),
                           padded(prompts), padded(outputs))
    batch = counter_batch()
    for slot, (p, prompt, out) in enumerate(zip(params, prompts, outputs, strict=True)):
        batch.add_request(slot, f"r{slot}", p, prompt, list(out), None)
    host = batch.sample(logits, list(range(rows)))
    assert host.sampled_token_ids[:, 0].tolist() == device.tokens.tolist()


def test_counter_draws_use_the_given_positions():
    logits = torch.zeros(1, VOCAB)
    params = SamplingParams(temperature=1.0, top_k=32, seed=11)
    drawn = set()
    for position in range(20):
        batch = counter_batch()
        batch.add_request(0, "r", params, [1], [], None)
        token = batch.sample(logits, [0], positions=[position]).sampled_token_ids[0, 0].item()
        device = sample_tokens(logits, to_device_params([params], VOCAB), torch.tensor([position]))
        assert token == device.tokens.item()
        drawn.add(token)
    assert len(drawn) > 5  # the position is the counter: the draws move with it


@pytest.mark.parametrize(
    "neighbour",
    [
        SamplingParams(min_p=0.2, temperature=1.0),
        SamplingParams(logit_bias={5: 30.0}, temperature=0.5),
        SamplingParams(allowed_token_ids=[1, 2, 3]),
        SamplingParams(min_tokens=3, temperature=1.0, seed=4),
        SamplingParams(temperature=1.0, top_k=0, seed=99),
    ],
    ids=["min_p", "logit_bias", "allowed_token_ids", "min_tokens", "whole_vocab"],
)
def test_seeded_row_ignores_host_only_neighbours(neighbour):
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    seeded = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=2024, repetition_penalty=1.2)
    alone, together = [], []
    for step in range(12):
        b = counter_batch()
        b.add_request(1, "s", seeded, [4, 5], list(range(step)), None)
        alone.append(b.sample(logits[:1], [1]).sampled_token_ids[0, 0].item())
        b.add_request(0, "n", neighbour, [7], [], None)
        together.append(b.sample(logits[[1, 0]], [0, 1]).sampled_token_ids[1, 0].item())
    assert together == alone


def test_generator_stream_is_the_default_and_advances_generators():
    b = HostSamplingBatch(2, VOCAB, make_vllm_config())
    assert b.seed_stream is SeedStream.GENERATOR
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    b.add_request(0, "r", SamplingParams(temperature=1.0, seed=5), [1], [], gen)
    b.sample(torch.zeros(1, VOCAB), [0])
    assert not torch.equal(gen.get_state(), state)


def test_counter_stream_leaves_generators_alone():
    b = counter_batch(2)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    b.add_request(0, "r", SamplingParams(temperature=1.0, seed=5), [1], [], gen)
    b.sample(torch.zeros(1, VOCAB), [0])
    assert torch.equal(gen.get_state(), state)


def test_positions_must_match_slots():
    b = counter_batch(2)
    b.add_request(0, "r", SamplingParams(temperature=1.0, seed=5), [1], [], None)
    with pytest.raises(ValueError, match="positions"):
        b.sample(torch.zeros(1, VOCAB), [0], positions=[1, 2])


def test_device_logprobs_are_raw_like_vllms_default():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(8))
    params = [SamplingParams(temperature=0.0, logprobs=0, presence_penalty=2.0, repetition_penalty=1.5),
              SamplingParams(temperature=0.7, top_k=10, seed=1, logprobs=0, frequency_penalty=1.0)]
    prompts, outputs = [[3, 4], [5]], [[6, 6], [7, 8, 7]]
    wire = to_device_params(params, VOCAB)
    device = sample_tokens(logits, wire, torch.tensor([3, 3]), padded(prompts), padded(outputs))
    b = counter_batch()
    for slot in range(2):
        b.add_request(slot, f"r{slot}", params[slot], prompts[slot], list(outputs[slot]), None)
    host = b.sample(logits, [0, 1])
    assert host.sampled_token_ids[:, 0].tolist() == device.tokens.tolist()
    torch.testing.assert_close(device.logprobs, host.logprobs_tensors.logprobs[:, 0])


def test_inverse_cdf_draw_picks_by_cumulative_mass():
    scaled = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-12]]))
    draw = lambda u, k=4, p=1.0: inverse_cdf_draw(  # noqa: E731
        scaled, top_k=torch.tensor([k]), top_p=torch.tensor([p]), uniforms=torch.tensor([u])
    ).item()
    assert [draw(0.0), draw(0.49), draw(0.51), draw(0.79), draw(0.81), draw(0.999)] == [0, 0, 1, 1, 2, 2]
    assert draw(0.9, k=2) == 1  # top-k 2: mass 0.8 renormalised, 0.9 lands in the second
    assert draw(0.99, p=0.6) == 1  # top-p 0.6 keeps the first two
    assert draw(0.99, p=0.0) == 0  # always keeps the best
