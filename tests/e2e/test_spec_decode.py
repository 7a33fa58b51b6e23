"""Speculative decoding with n-gram drafts on the host backend (issue 19), one engine start.

The engine verifies vLLM's ``NgramProposer`` drafts in fixed-shape ``[rows, 1 + K]`` verify
steps; greedy outputs must equal transformers', token for token, however many drafts are
accepted, alone and with more requests than rows and KV blocks, under preemption with drafts in
flight, with ``max_tokens`` and stop tokens exact. Seeded sampled rows take drafts and keep the
tokens of serving without them; sampled continuations keep the target distribution (chi-square
against transformers' exact probabilities) while drafts are accepted and rejected.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.helpers import assert_greedy_equal, hf_greedy, offline_llm, repetitive_prompts

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24
MAX_NUM_SEQS = 4


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):

    model_dir = tiny_checkpoint("llama")
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=MAX_NUM_SEQS, max_model_len=256, seed=0,
        speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1},
        # a small KV pool (4 blocks of 64 tokens): admission waits for blocks, rows queue
        num_gpu_blocks_override=5, disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def _generate(llm, prompts, params):
    from vllm.inputs import TokensPrompt

    return [list(r.outputs[0].token_ids) for r in llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                                               params, use_tqdm=False)]


def test_greedy_equals_transformers_alone_and_concurrent(engine):
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    together = _generate(llm, prompts, params)  # more requests than rows and KV blocks: queueing
    alone = [_generate(llm, [p], params)[0] for p in prompts[:3]]
    assert together == expected
    assert alone == expected[:3]
    metrics = {m.name: m for m in llm.get_metrics()}
    drafts = metrics["vllm:spec_decode_num_draft_tokens"].value
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value
    assert drafts > 0 and 0 < accepted <= drafts, (drafts, accepted)


def _counter(llm, name: str) -> int:
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


def test_preemption_with_drafts_in_flight_stays_exact(engine):
    """Four rows that each grow to three KV blocks in a pool of four: vLLM preempts rows that
    carry drafts (their drafts dropped, their KV freed) and later recomputes them, and every
    output is still transformers'."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]  # 30-36 tokens: one block each
    max_tokens = 100
    expected = hf_greedy(model_dir, prompts, max_tokens)
    preempted = _counter(llm, "vllm:num_preemptions")
    accepted = _counter(llm, "vllm:spec_decode_num_accepted_tokens")
    got = _generate(llm, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    assert_greedy_equal(prompts, got, expected)
    assert _counter(llm, "vllm:num_preemptions") > preempted
    assert _counter(llm, "vllm:spec_decode_num_accepted_tokens") > accepted


def test_max_tokens_and_stop_are_exact(engine):
    """Drafts never run past max_tokens or a stop token: the output ends where the plain
    greedy continuation says it must."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    full = hf_greedy(model_dir, [prompt], MAX_NEW_TOKENS)[0]
    for n in (1, 2, 5):
        assert _generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0] == full[:n]
    stop = full[6]
    cut = full[: full.index(stop) + 1]
    got = _generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, stop_token_ids=[stop]))
    assert got[0] == cut


def test_sampled_and_logprob_requests_are_served(engine):
    """Sampled rows go through vLLM's rejection sampler; a logprobs request makes its batch
    run without drafts: neither is refused, and seeded sampling reproduces."""
    from vllm import SamplingParams

    _, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]
    sampled = _generate(llm, prompts, SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True))
    assert all(len(t) == 16 for t in sampled)
    seeded = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=7)
    assert _generate(llm, prompts[:2], seeded) == _generate(llm, prompts[:2], seeded)
    out = llm.generate([{"prompt_token_ids": prompts[0]}],
                       SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs) == 8


SAMPLED = {"temperature": 0.5, "top_k": 4}
"""The tiny model's logits are nearly flat but ordered: at temperature 0.5 its 4 best tokens
after its own greedy loop have probabilities ~0.70, 0.11, 0.10, 0.09 (at 1.0: ~0.47, 0.19,
0.18, 0.17, too flat for 400 samples to tell temperature 1.25 from 1), so a draft continuing
the loop is kept most of the time, and a row that leaves the loop gets drafts that miss."""


def loop_prompt(model_dir: Path, llm) -> list[int]:
    """A repetitive prompt followed by the model's own greedy loop: n-gram drafts continue the
    loop, the token the model likes best, so sampled rows accept a fair share of them."""
    base = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    return base + hf_greedy(model_dir, [base], 8)[0]


def counter_replay(model_dir: Path, prompt: list[int], seed: int, max_tokens: int) -> list[int]:
    """The tokens a seeded request draws without speculation, on the device or the host: at each
    position the counter-stream uniform ``seeded_uniform(seed, position)`` picks by inverse CDF
    from transformers' top-k distribution."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm_tt_sampling.device.draw import inverse_cdf_draw
    from vllm_tt_sampling.device.rng import seeded_uniform

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            scaled = model(torch.tensor([tokens])).logits[:, -1].float() / SAMPLED["temperature"]
            uniform = torch.tensor([seeded_uniform(seed, len(tokens) - 1)], dtype=torch.float64)
            top_k = torch.tensor([SAMPLED["top_k"]])
            draw = inverse_cdf_draw(scaled, top_k=top_k, top_p=torch.ones(1), uniforms=uniform)
            tokens.append(int(draw[0]))
    return tokens[len(prompt):]


def test_seeded_sampling_takes_drafts_and_keeps_its_tokens(engine):
    """Seeded sampled rows take drafts: a draft stands while it equals the row's own
    counter-stream draw, so a seeded request gets the tokens it would get without speculation
    (transformers' logits replayed with the same uniforms), alone and next to other requests."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = [loop_prompt(model_dir, llm), *repetitive_prompts(llm.get_tokenizer().vocab_size)[1:3]]
    seeded = [SamplingParams(max_tokens=16, ignore_eos=True, seed=100 + i, **SAMPLED)
              for i in range(len(prompts))]
    neighbour = SamplingParams(max_tokens=16, ignore_eos=True, **SAMPLED)
    accepted = _counter(llm, "vllm:spec_decode_num_accepted_tokens")
    alone = [_generate(llm, [p], s)[0] for p, s in zip(prompts, seeded, strict=True)]
    assert _counter(llm, "vllm:spec_decode_num_accepted_tokens") > accepted  # seeded rows kept drafts
    together = _generate(llm, [*prompts, *prompts], [*seeded, *[neighbour] * len(prompts)])[: len(prompts)]
    assert together == alone
    assert alone == [counter_replay(model_dir, p, s.seed, 16) for p, s in zip(prompts, seeded, strict=True)]


DIST_TOKENS = 4
DIST_SAMPLES = 400
DIST_ALPHA = 1e-3
"""False-failure probability of each chi-square test below (when the engine is right)."""


def continuation_probs(model_dir: Path, prompt: list[int], length: int,
                       temperature: float = SAMPLED["temperature"]) -> dict[tuple[int, ...], float]:
    """Transformers' exact probability of every ``length``-token continuation (top-k as in
    ``SAMPLED``)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    level: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            prefixes = list(level)
            logits = model(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1].float()
            values, ids = (logits / temperature).topk(SAMPLED["top_k"], dim=-1)
            probs = values.softmax(dim=-1, dtype=torch.float64)
            level = {
                prefix + (int(t),): level[prefix] * float(q)
                for prefix, row_ids, row_probs in zip(prefixes, ids, probs, strict=True)
                for t, q in zip(row_ids, row_probs, strict=True)
            }
    return level


def chi_square_survival(x: float, df: int) -> float:
    """P(chi-square with ``df`` degrees of freedom >= x), exact (regularized upper gamma)."""
    half = x / 2
    if df % 2 == 0:
        term = total = 1.0
        for i in range(1, df // 2):
            term *= half / i
            total += term
        return math.exp(-half) * total
    total, term = math.erfc(math.sqrt(half)), math.sqrt(half) / math.gamma(1.5)
    for i in range(df // 2):
        total += math.exp(-half) * term
        term *= half / (i + 1.5)
    return total


def chi_square_p_value(samples: list[tuple[int, ...]], probs: dict[tuple[int, ...], float]) -> float:
    """Pearson's goodness of fit of ``samples`` to ``probs``: continuations expected at least 5
    times are their own bin, the rest one pooled bin (folded into the smallest if expected < 5)."""
    n = len(samples)
    counts = Counter(samples)
    bins = [(counts[seq], n * p) for seq, p in probs.items() if n * p >= 5]
    kept = {seq for seq, p in probs.items() if n * p >= 5}
    rest = (sum(c for seq, c in counts.items() if seq not in kept), n - sum(e for _, e in bins))
    if rest[1] >= 5:
        bins.append(rest)
    else:
        bins.sort(key=lambda b: b[1])
        bins[0] = (bins[0][0] + rest[0], bins[0][1] + rest[1])
    statistic = sum((observed - expected) ** 2 / expected for observed, expected in bins)
    return chi_square_survival(statistic, len(bins) - 1)


def test_sampled_continuations_keep_the_target_distribution(engine):
    """Sampled 4-token continuations under speculation follow transformers' exact distribution
    (Pearson chi-square over the continuations, ``DIST_ALPHA``), unseeded (vLLM's rejection
    sampler) and seeded (one seed per request: deterministic), while drafts are accepted 20-90 %
    of the time. The seeded sample also rejects the distribution at 1.25 times the temperature
    (power ~0.99 at 400 samples, simulated): the test tells nearby distributions apart."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompt = loop_prompt(model_dir, llm)
    probs = continuation_probs(model_dir, prompt, DIST_TOKENS)
    for seeds in ([None] * DIST_SAMPLES, list(range(DIST_SAMPLES))):
        drafted = _counter(llm, "vllm:spec_decode_num_draft_tokens")
        accepted = _counter(llm, "vllm:spec_decode_num_accepted_tokens")
        params = [SamplingParams(max_tokens=DIST_TOKENS, ignore_eos=True, seed=s, **SAMPLED) for s in seeds]
        samples = [tuple(t) for t in _generate(llm, [prompt] * DIST_SAMPLES, params)]
        drafted = _counter(llm, "vllm:spec_decode_num_draft_tokens") - drafted
        acceptance = (_counter(llm, "vllm:spec_decode_num_accepted_tokens") - accepted) / max(drafted, 1)
        assert drafted >= DIST_SAMPLES and 0.2 <= acceptance <= 0.9, (seeds[0], drafted, acceptance)
        assert chi_square_p_value(samples, probs) > DIST_ALPHA, (seeds[0], chi_square_p_value(samples, probs))
    hotter = continuation_probs(model_dir, prompt, DIST_TOKENS, temperature=1.25 * SAMPLED["temperature"])
    assert chi_square_p_value(samples, hotter) < DIST_ALPHA
