"""Checks every speculative decoding method must pass, shared by the n-gram and drafter-model
tests: greedy and sampled generation through ``vllm.LLM``, vLLM's spec-decode counters, the
chi-square test of sampled continuations against transformers' exact distribution, and the
OpenAI-client calls of the serve tests."""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.e2e.helpers import hf_greedy, repetitive_prompts, serve, served_metric


def generate(llm, prompts, params):
    """Token ids of each prompt's first completion, in order."""
    from vllm.inputs import TokensPrompt

    return [list(r.outputs[0].token_ids) for r in llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                                               params, use_tqdm=False)]


def mixed_prompts(vocab: int, count: int = 24) -> list[list[int]]:
    """The n-gram workload's prompts and random ones of 8-60 tokens (where the drafter's and
    the target's greedy choices part more often)."""
    rng = random.Random(31)
    base = repetitive_prompts(vocab)
    return base + [[rng.randrange(3, vocab) for _ in range(rng.randrange(8, 60))] for _ in range(count - len(base))]


def counter(llm, name: str) -> int:
    """A vLLM counter of ``llm.get_metrics()``, summed over its label sets."""
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


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



def assert_keeps_target_distribution(llm, model_dir: Path, prompt: list[int],
                                     acceptance_range: tuple[float, float] = (0.2, 0.9),
                                     tells_hotter_apart: bool = True) -> None:
    """Sampled 4-token continuations of ``prompt`` under speculation follow transformers' exact
    distribution (Pearson chi-square over the continuations, ``DIST_ALPHA``), unseeded (vLLM's
    rejection sampler) and seeded (one seed per request: deterministic), while the share of
    drafts accepted stays in ``acceptance_range``. The seeded sample also rejects the
    distribution at 1.25 times the temperature (power ~0.99 at 400 samples, simulated): the
    test tells nearby distributions apart; ``tells_hotter_apart=False`` skips that power check
    for a checkpoint whose 1.25x-hotter distribution 400 samples cannot tell apart (a trained
    model's peaked top-k: its expected chi-square excess is below the 1e-3 threshold's)."""
    from vllm import SamplingParams

    probs = continuation_probs(model_dir, prompt, DIST_TOKENS)
    low, high = acceptance_range
    for seeds in ([None] * DIST_SAMPLES, list(range(DIST_SAMPLES))):
        drafted = counter(llm, "vllm:spec_decode_num_draft_tokens")
        accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
        params = [SamplingParams(max_tokens=DIST_TOKENS, ignore_eos=True, seed=s, **SAMPLED) for s in seeds]
        samples = [tuple(t) for t in generate(llm, [prompt] * DIST_SAMPLES, params)]
        drafted = counter(llm, "vllm:spec_decode_num_draft_tokens") - drafted
        acceptance = (counter(llm, "vllm:spec_decode_num_accepted_tokens") - accepted) / max(drafted, 1)
        assert drafted >= DIST_SAMPLES and low <= acceptance <= high, (seeds[0], drafted, acceptance)
        assert chi_square_p_value(samples, probs) > DIST_ALPHA, (seeds[0], chi_square_p_value(samples, probs))
    if tells_hotter_apart:
        hotter = continuation_probs(model_dir, prompt, DIST_TOKENS, temperature=1.25 * SAMPLED["temperature"])
        assert chi_square_p_value(samples, hotter) < DIST_ALPHA


# -- through `vllm serve` (the OpenAI client) ---------------------------------------------------

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
"""Greedy completions of a fixed length that return their token ids."""


def assert_stop_strings_exact(url: str, prompts: list[list[int]]) -> None:
    """A stop string from the middle of each greedy continuation ends the text right before it,
    streamed or not (at least 3 prompts tested), although a verify step's accepted drafts may
    run past it."""
    tested = 0
    for prompt in prompts:
        full = complete(url, prompt, **GREEDY)["choices"][0]["text"]
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        if len(stop) < 3 or "\ufffd" in stop:  # short text, or inside an incomplete UTF-8 run
            continue
        cut = full[: full.index(stop)]
        assert complete(url, prompt, stop=[stop], **GREEDY)["choices"][0]["text"] == cut
        assert stream(url, prompt, stop=[stop], **GREEDY)[0] == cut
        tested += 1
    assert tested >= 3


SELF_DRAFTING_TEXTS = ("The scheduler", "A lane is", "Each trace", "one two three one two three")
"""Prompts of the self-drafting tests (block output, the model's own drafter)."""


@contextlib.contextmanager
def self_drafting_server(arch: str, log: Path, max_new_tokens: int, *args: str,
                         texts: tuple[str, ...] = SELF_DRAFTING_TEXTS, env: dict[str, str] | None = None,
                         ) -> Iterator[tuple[str, list[list[int]], list[list[int]]]]:
    """``vllm serve`` of the tiny ``arch`` trained 200 steps (its half-depth drafter agrees now
    and then) with ``args``: its URL, the prompts of ``texts`` and transformers' greedy
    continuations of them."""
    from transformers import AutoTokenizer
    from vllm_tt_testing.checkpoints import cached_tiny

    model_dir = cached_tiny(arch, 200)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(t) for t in texts]
    with serve(model_dir, "--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "256",
               "--seed", "0", "--block-size", "32", *args, env=env, log=log) as url:
        yield url, prompts, hf_greedy(model_dir, prompts, max_new_tokens)


def decode_steps(url: str) -> float:
    """Decode steps the engine ran (``vllm_tt:steps`` with phase ``decode``)."""
    return served_metric(url, "vllm_tt:steps_total", 'phase="decode"')


def settled_decode_steps(url: str) -> float:
    """The decode step count once the engine's metrics thread (every 0.25 s) has sent it."""
    last, deadline = decode_steps(url), time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = decode_steps(url)
        if now == last:
            return now
        last = now
    return last


def client_for(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused")


def complete(url: str, prompt: list[int], max_tokens: int = 24, **kwargs: Any) -> dict[str, Any]:
    return client_for(url).completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                              **kwargs).model_dump()


def stream(url: str, prompt: list[int], max_tokens: int = 24, **kwargs: Any) -> tuple[str, list[int]]:
    """The streamed text and token ids, joined from the chunks."""
    text, ids = [], []
    for chunk in client_for(url).completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                    stream=True, **kwargs):
        choice = chunk.model_dump()["choices"][0]
        text.append(choice["text"])
        ids.extend(choice.get("token_ids") or [])
    return "".join(text), ids


def concurrently(fn: Any, calls: list[tuple[Any, ...]]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda args: fn(*args), calls))


def accepted_drafts(url: str) -> float:
    """vLLM's acceptance counter, summed over its label sets."""
    return served_metric(url, "vllm:spec_decode_num_accepted_tokens_total")


DRAFTED = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PREEMPTIONS = "vllm:num_preemptions"


def assert_greedy_exact_alone_and_concurrent(llm, model_dir: Path, max_new_tokens: int,
                                             preempts: bool = False) -> None:
    """Greedy outputs of the 24 mixed prompts at once (more than rows and KV blocks: rows queue
    and are preempted with drafts in flight; with ``preempts`` vLLM must have preempted some)
    equal transformers' target outputs, with drafts accepted and rejected; the last three alone
    too."""
    from vllm import SamplingParams

    from tests.e2e.helpers import assert_greedy_equal

    prompts = mixed_prompts(llm.get_tokenizer().vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, max_new_tokens)
    drafted, accepted, preempted = counter(llm, DRAFTED), counter(llm, ACCEPTED), counter(llm, PREEMPTIONS)
    together = generate(llm, prompts, params)
    assert_greedy_equal(prompts, together, expected)
    drafted, accepted = counter(llm, DRAFTED) - drafted, counter(llm, ACCEPTED) - accepted
    assert 0 < accepted < drafted, (drafted, accepted)  # drafts accepted and rejected
    if preempts:
        assert counter(llm, PREEMPTIONS) > preempted
    alone = [generate(llm, [p], params)[0] for p in prompts[-3:]]
    assert alone == expected[-3:]


def assert_max_tokens_stop_tokens_and_eos_exact(llm, model_dir: Path, max_new_tokens: int) -> None:
    """Accepted drafts never run past ``max_tokens``, a stop token or EOS (a trained tiny
    model ends corpus-like text with its EOS)."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    prompt = mixed_prompts(tokenizer.vocab_size)[10]
    full = hf_greedy(model_dir, [prompt], max_new_tokens)[0]
    for n in (1, 2, 5):
        assert generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0] == full[:n]
    stop = full[6]
    got = generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=[stop]))
    assert got[0] == full[: full.index(stop) + 1]
    eos_prompts = [tokenizer.encode(t) for t in ("The scheduler", "A lane is", "Each trace", "The runner")]
    untils = hf_greedy(model_dir, eos_prompts, 64)
    ended = [(p, full[: full.index(tokenizer.eos_token_id) + 1]) for p, full in zip(eos_prompts, untils, strict=True)
             if tokenizer.eos_token_id in full]
    assert ended, "precondition: the tiny model ends one of these prompts with EOS within 64 tokens"
    got = generate(llm, [p for p, _ in ended], SamplingParams(temperature=0.0, max_tokens=64))
    assert got == [cut for _, cut in ended]


def assert_served_streaming_equals_plain(url: str, model_dir: Path, prompts: list[list[int]],
                                        max_new_tokens: int) -> None:
    """Greedy streaming equals non-streaming equals transformers' target for every prompt at
    once (8 clients), and vLLM's /metrics count accepted drafts."""
    from tests.e2e.helpers import assert_greedy_equal

    expected = hf_greedy(model_dir, prompts, max_new_tokens)
    before = accepted_drafts(url)
    plain = concurrently(lambda p: complete(url, p, max_new_tokens, **GREEDY), [(p,) for p in prompts])
    streamed = concurrently(lambda p: stream(url, p, max_new_tokens, **GREEDY), [(p,) for p in prompts])
    assert_greedy_equal(prompts, [r["choices"][0]["token_ids"] for r in plain], expected)
    assert [ids for _, ids in streamed] == expected
    assert [text for text, _ in streamed] == [r["choices"][0]["text"] for r in plain]
    assert complete(url, prompts[0], max_new_tokens, **GREEDY)["choices"][0]["token_ids"] == expected[0]
    assert accepted_drafts(url) > before
