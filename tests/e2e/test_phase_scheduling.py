"""Phase scheduling end to end: mixed-length prompts (several longer than the per-step token
budget, so they are chunked) give the same greedy output batched as alone, and the step trace
shows only prefill-only, decode-only or empty steps; under the step-counted policy and under the
cost-aware one (``tt.step_cost``: the platform hands the scheduler a step cost model)."""

from __future__ import annotations

import json
import random

import pytest

from tests.e2e.helpers import offline_llm

pytestmark = pytest.mark.e2e

BUDGET = 64


@pytest.fixture(scope="module", params=[None, "llama-3.1-8b@N150"], ids=["step-counted", "cost-aware"])
def traced_engine(request, tiny_checkpoint, tmp_path_factory):
    import os

    trace = tmp_path_factory.mktemp("trace") / "steps.jsonl"
    os.environ["TT_STEP_TRACE"] = str(trace)
    tt = {"mesh_backend": "host"} if request.param is None else {"mesh_backend": "host", "step_cost": request.param}
    try:
        llm = offline_llm(model=str(tiny_checkpoint("qwen3")), max_num_seqs=4, max_model_len=512,
                  max_num_batched_tokens=BUDGET, seed=0, additional_config={"tt": tt})
    finally:
        del os.environ["TT_STEP_TRACE"]
    yield llm, trace
    del llm


def test_batched_equals_alone_and_no_step_is_mixed(traced_engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, trace = traced_engine
    rng = random.Random(7)
    lengths = [5, 150, 12, 70, 200, 33, 9, 130]
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(3, 500) for _ in range(n)]) for n in lengths]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)

    batched = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    alone = [list(llm.generate([p], params)[0].outputs[0].token_ids) for p in prompts]
    assert batched == alone

    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert steps, "TT_STEP_TRACE wrote nothing"
    assert {s["phase"] for s in steps} <= {"prefill", "decode", "empty"}
    for s in steps:
        tokens = list(s["scheduled"].values())
        if s["phase"] == "decode":
            assert all(t == 1 for t in tokens), s
        assert sum(tokens) <= BUDGET, s
    assert any(s["phase"] == "prefill" and s["scheduled"] and max(s["scheduled"].values()) < 150 and
               sum(s["scheduled"].values()) == BUDGET for s in steps), "no prompt was chunked"
    phases = [s["phase"] for s in steps if s["phase"] != "empty"]
    assert any(a == "decode" and b == "prefill" for a, b in zip(phases, phases[1:], strict=False)), "no decode between prefills"
