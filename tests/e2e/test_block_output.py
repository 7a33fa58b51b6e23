"""Adaptive block output through ``vllm.LLM`` (issue 31 item 4), one engine start: the trained
tiny llama with ``--additional-config.tt.block_tokens 4`` drafts with its own first layers and
verifies inside ``decode_forward``, committing 1 to 4 tokens per row per decode step.

Greedy outputs equal transformers' token for token (4 rows at once); ``max_tokens`` inside a
block and a stop token inside a block end the output exactly."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import hf_greedy, offline_llm

pytestmark = pytest.mark.e2e

BLOCK = 4
MAX_NEW_TOKENS = 20
TRAIN_STEPS = 200  # the KV offload tests' checkpoint


@pytest.fixture(scope="module")
def engine():
    from vllm_tt_testing.checkpoints import cached_tiny

    model_dir = cached_tiny("llama", TRAIN_STEPS)
    llm = offline_llm(model=str(model_dir), max_num_seqs=4, max_model_len=256, seed=0, block_size=32,
                      additional_config={"tt": {"mesh_backend": "host", "block_tokens": BLOCK}})
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(t) for t in ("The scheduler", "A lane is", "Each trace", "one two three one two three")]
    yield llm, prompts, hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    del llm


def _generate(llm, prompts, **params):
    from vllm import SamplingParams

    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, **params))
    return [list(o.outputs[0].token_ids) for o in outs]


def test_greedy_blocks_equal_transformers(engine):
    llm, prompts, expected = engine
    assert _generate(llm, prompts, max_tokens=MAX_NEW_TOKENS, ignore_eos=True) == expected


def test_max_tokens_and_stop_tokens_inside_a_block_are_exact(engine):
    llm, prompts, expected = engine
    for n in (1, 3, 5):  # 3 and 5 end inside a block of 4
        assert _generate(llm, prompts[:1], max_tokens=n, ignore_eos=True) == [expected[0][:n]]
    stop = expected[1][5]
    got = _generate(llm, prompts[1:2], max_tokens=MAX_NEW_TOKENS, ignore_eos=True, stop_token_ids=[stop])
    assert got == [expected[1][: expected[1].index(stop) + 1]]
