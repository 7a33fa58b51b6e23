"""Overlapped decode through vLLM's engine (in-process, async scheduling on) on the host mesh
backend with modelled device time: outputs equal the same engine with overlap off, under
arrivals, aborts, preemption, finishes and injected delays; each drain rule seen in action."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from vllm_tt_platform.faults import NO_FAULTS
from vllm_tt_testing.faults import RandomFaults

pytestmark = pytest.mark.e2e

TT = {"mesh_backend": "host", "sample_on_device_mode": "all", "host_device_time": "200us", "host_skip_math": True}
MAX_NUM_SEQS = 8
KV_BLOCKS = 24
"""24 blocks of 32 tokens: eight requests cannot all grow, so the scheduler preempts."""
STEP_LIMIT = 20_000


def make_engine(model_dir, *, overlap: bool):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=str(model_dir), max_num_seqs=MAX_NUM_SEQS, max_model_len=256, block_size=32,
        num_gpu_blocks_override=KV_BLOCKS, seed=0, async_scheduling=overlap, enable_prefix_caching=False,
        additional_config={"tt": dict(TT)},
    )
    return LLMEngine.from_engine_args(args)


def runner_of(engine):
    return engine.engine_core.engine_core.model_executor.driver_worker.worker.runner


@pytest.fixture(scope="module")
def engines(tiny_checkpoint):
    """(overlap on, overlap off): the same configuration with and without async scheduling."""
    model_dir = tiny_checkpoint("llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        on, off = make_engine(model_dir, overlap=True), make_engine(model_dir, overlap=False)
    assert runner_of(on).overlap.enabled and not runner_of(off).overlap.enabled
    yield on, off
    for engine in (on, off):
        engine.engine_core.shutdown()


@dataclass
class Req:
    req_id: str
    prompt: list[int]
    params: object
    arrive: int = 0
    abort: int | None = None


@dataclass
class Run:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    steps: int = 0
    host_checks: int = 0
    """Host tokens compared with delivered ones, over the run."""


def run(engine, requests: list[Req], *, aborts: bool = True) -> Run:
    """Drive ``engine`` step by step: requests arrive (and are aborted) at given step numbers.
    After every step, the runner's host copy of each request's tokens must agree with what the
    engine delivered (it may lag or lead by the steps in flight, never differ)."""
    from vllm.inputs import TokensPrompt

    batch = runner_of(engine).batch
    result = Run()
    last_arrival = max(r.arrive for r in requests)
    while result.steps <= last_arrival or engine.has_unfinished_requests():
        for r in requests:
            if r.arrive == result.steps:
                engine.add_request(r.req_id, TokensPrompt(prompt_token_ids=r.prompt), r.params)
            if aborts and r.abort == result.steps and r.req_id not in result.finished:
                engine.abort_request([r.req_id])
        for out in engine.step():
            result.outputs[out.request_id] = list(out.outputs[0].token_ids)
            if out.finished:
                result.finished.add(out.request_id)
        for state in batch:
            delivered = result.outputs.get(state.req_id.rsplit("-", 1)[0], [])  # vLLM suffixes ids
            common = min(len(delivered), len(state.output_token_ids))
            assert state.output_token_ids[:common] == delivered[:common], (
                f"step {result.steps}: host tokens of {state.req_id} diverge from the delivered ones")
            result.host_checks += common
        result.steps += 1
        if result.steps > STEP_LIMIT:
            raise AssertionError(f"no progress after {STEP_LIMIT} steps; unfinished: "
                                 f"{sorted(set(result.outputs) - result.finished)}")
    return result


def assert_same_outputs(overlapped: Run, reference: Run, requests: list[Req]) -> None:
    """Every request's tokens equal the reference's; an aborted one's are a prefix of them."""
    aborted = {r.req_id for r in requests if r.abort is not None}
    wrong = []
    for r in requests:
        got, want = overlapped.outputs.get(r.req_id, []), reference.outputs[r.req_id]
        if got != want and not (r.req_id in aborted and want[: len(got)] == got):
            wrong.append((r.req_id, got[:8], want[:8], len(got), len(want)))
    assert not wrong, f"{len(wrong)} requests differ (id, got, want, lengths): {wrong[:3]}"


def random_requests(seed: int, count: int) -> list[Req]:
    """Greedy and seeded requests of random lengths arriving over time; some are aborted. A few
    need host work between steps (penalties, a top-k beyond the device, min_tokens): their
    steps read the host's copy of the tokens, so a token lost or doubled there shows."""
    from vllm import SamplingParams

    rng = random.Random(seed)
    requests = []
    for i in range(count):
        prompt = [rng.randrange(3, 1000) for _ in range(rng.randint(3, 60))]
        max_tokens = rng.randint(1, 120)
        kind = rng.random()
        if kind < 0.45:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        elif kind < 0.9:
            params = SamplingParams(temperature=rng.uniform(0.5, 1.2), top_k=rng.randint(2, 32),
                                    top_p=rng.uniform(0.5, 1.0), seed=rng.randrange(1 << 30),
                                    max_tokens=max_tokens, ignore_eos=True)
        elif kind < 0.94:
            params = SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5,
                                    max_tokens=max_tokens, ignore_eos=True)
        elif kind < 0.97:
            params = SamplingParams(temperature=0.8, top_k=64, seed=rng.randrange(1 << 30),
                                    max_tokens=max_tokens, ignore_eos=True)
        else:
            params = SamplingParams(temperature=0.0, min_tokens=max_tokens // 2, max_tokens=max_tokens,
                                    ignore_eos=True)
        arrive = rng.randint(0, count * 8)
        abort = arrive + rng.randint(1, 60) if rng.random() < 0.15 else None
        requests.append(Req(f"s{seed}-{i}", prompt, params, arrive, abort))
    return requests


def with_faults(engine, seed: int):
    runner = runner_of(engine)
    faults = RandomFaults(seed=seed, max_delay_s=0.001)
    runner.overlap.faults = faults
    runner.mesh_device.faults = faults
    return faults


@pytest.mark.parametrize("seed", [0, 1])
def test_overlap_stress_matches_overlap_off(engines, seed):
    """~1,400 engine steps per seed, most submitted while the previous step is in flight, with
    random delays at submit, readback, finalise and apply, and finalisation raced from another
    thread; the reference run has no aborts."""
    on, off = engines
    requests = random_requests(seed, 150)
    stats = runner_of(on).overlap.stats
    before = (stats.overlapped, dict(stats.drains))
    faults = with_faults(on, seed)
    try:
        overlapped = run(on, requests)
    finally:
        faults.join()
        runner_of(on).overlap.faults = runner_of(on).mesh_device.faults = NO_FAULTS
    reference = run(off, requests, aborts=False)
    assert_same_outputs(overlapped, reference, requests)
    assert overlapped.steps > 1000 and overlapped.host_checks > 10_000
    assert stats.overlapped - before[0] > 500
    drained = {k for k, v in stats.drains.items() if v > before[1].get(k, 0)}
    assert {"new request", "finished request", "preempted request", "resumed request"} <= drained
    assert not runner_of(on).overlap.in_flight


def test_real_math_overlap_matches_overlap_off(engines):
    """The same with the tiny model's real math (greedy and seeded)."""
    on, off = engines
    models = [runner_of(e).model for e in engines]
    synthetic = [m.synthetic for m in models]
    requests = [r for r in random_requests(7, 24) if r.abort is None]
    try:
        for model in models:
            model.synthetic = None
        overlapped, reference = run(on, requests), run(off, requests)
    finally:
        for model, stand_in in zip(models, synthetic, strict=True):
            model.synthetic = stand_in
    assert_same_outputs(overlapped, reference, requests)
    assert runner_of(on).overlap.stats.overlapped > 0


def steady_pair(steps: int = 60) -> list[Req]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    return [Req("a", [11, 12, 13], params), Req("b", [21, 22, 23, 24], params)]


def scenario_requests(name: str) -> list[Req]:
    """Two long-running decodes, plus what the scenario adds at step 12."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    base = steady_pair()
    joiner = {
        "new request": SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        "penalties": SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=20, ignore_eos=True),
        "logprobs": SamplingParams(temperature=0.0, logprobs=0, max_tokens=20, ignore_eos=True),
        "host sampling": SamplingParams(temperature=0.9, top_k=100, seed=5, max_tokens=20, ignore_eos=True),
        "min_tokens": SamplingParams(temperature=0.0, min_tokens=8, max_tokens=30, ignore_eos=True),
        "structured output": SamplingParams(temperature=0.0, max_tokens=6,
                                            structured_outputs=StructuredOutputsParams(regex="[0-9]{6}")),
    }
    if name == "steady":
        return base
    if name == "abort":
        base[1].abort = 15
        return base
    if name == "preemption":
        params = SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)
        return [Req(f"p{i}", [30 + i] * 40, params, arrive=i) for i in range(6)]
    return [*base, Req("joiner", [5, 6, 7, 8, 9], joiner[name], arrive=12)]


INCIDENTAL = {"rows changed", "finished request", "empty step"}
"""Drains any scenario may see: requests finishing, or left out of a step near their end."""

# (scenario, drains expected, other drains allowed, decode steps expected to run synchronously,
# overlap after the event)
DRAIN_CASES = [
    ("steady", set(), set(), set(), True),
    ("new request", {"new request"}, set(), set(), True),
    ("abort", {"finished request"}, set(), set(), True),
    ("preemption", {"preempted request"}, {"new request", "resumed request"}, set(), True),
    ("penalties", {"new request"}, set(), {"penalties"}, True),
    ("logprobs", {"new request"}, set(), {"logprobs"}, True),
    ("host sampling", {"new request"}, set(), {"host sampling"}, True),
    ("min_tokens", {"new request"}, set(), {"host sampling"}, True),
    ("structured output", {"new request"}, set(), {"host sampling"}, True),
]


@pytest.mark.parametrize(("name", "drains", "allowed", "sync_reasons", "resumes"), DRAIN_CASES,
                         ids=[c[0] for c in DRAIN_CASES])
def test_drain_rules_in_the_engine(engines, name, drains, allowed, sync_reasons, resumes):
    """Overlap is kept through steady decode and dropped (drained, or the step run
    synchronously) exactly for the scenario's reason; outputs never change."""
    on, off = engines
    overlap = runner_of(on).overlap
    requests = scenario_requests(name)
    before_drains, before_sync = dict(overlap.stats.drains), dict(overlap.stats.not_overlapped)
    before_overlapped = overlap.stats.overlapped
    overlapped = run(on, requests)
    assert_same_outputs(overlapped, run(off, requests, aborts=False), requests)
    new_drains = {k for k, v in overlap.stats.drains.items() if v > before_drains.get(k, 0)}
    new_sync = {k.split(" (")[0] for k, v in overlap.stats.not_overlapped.items() if v > before_sync.get(k, 0)}
    assert drains <= new_drains, overlap.stats.drains
    assert new_drains <= drains | allowed | INCIDENTAL
    assert new_sync == sync_reasons
    assert (overlap.stats.overlapped - before_overlapped > 20) is resumes
    assert not overlap.in_flight
