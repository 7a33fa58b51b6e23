"""The step cost model and the cost-aware phase policy: decisions as tables, then the scheduler
over the simulator with a cost model handed in (phase-pure steps, exact outputs)."""

from __future__ import annotations

import pytest
from vllm_tt_scheduler import SchedulerOptions, TTScheduler
from vllm_tt_scheduler.cost import STEP_COST_KEY, RooflineStepCost, record_step_cost
from vllm_tt_scheduler.cost_policy import CostAwarePolicy, policy_for
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import PhasePolicy, WorkView
from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler, greedy_tokens, make_request

P, D, E = Phase.PREFILL, Phase.DECODE, Phase.EMPTY

# A mesh streaming its weights in 39 ms (+1 ms per program), prefill 0.2 ms per token.
COST = RooflineStepCost(
    program_s=0.001, weights_s=0.039, kv_s_per_token=1e-7, prefill_s_per_token=2e-4,
    attention_s_per_token_pair=1e-9, description="test mesh",
)


def test_prefill_step_takes_the_longer_of_the_weight_stream_and_its_rows_compute() -> None:
    assert COST.prefill_s(0, 0) == 0.0
    assert COST.prefill_s(50, 1) == pytest.approx(0.040)  # stream-bound: 11 ms of compute
    assert COST.prefill_compute_s(50, 1) == pytest.approx(0.001 + 50 * 2e-4 + 1e-9 * 50 * 25)
    one = COST.prefill_s(500, 1)
    assert one == pytest.approx(0.001 + 0.1 + 1e-9 * 500 * 250)
    assert COST.prefill_s(1000, 2) == pytest.approx(2 * one)  # compute adds up over rows
    assert COST.prefill_s(1000, 1) == pytest.approx(0.001 + 0.2 + 1e-9 * 1000 * 500)


def test_decode_step_streams_the_weights_and_reads_the_kv() -> None:
    assert COST.decode_s(0, 0) == 0.0
    assert COST.decode_s(32, 0) == pytest.approx(0.040)
    assert COST.decode_s(32, 10_000) == pytest.approx(0.041)
    assert COST.decode_s(1, 10_000) == COST.decode_s(32, 10_000)  # the roofline ignores rows


def test_cost_model_travels_in_the_tt_section() -> None:
    tt: dict[str, object] = {}
    record_step_cost(tt, COST)
    assert SchedulerOptions.from_additional_config({"tt": tt}).step_cost == COST
    assert SchedulerOptions.from_additional_config({"tt": {}}).step_cost is None


@pytest.mark.parametrize(
    ("value", "named"),
    [({"program_s": 1.0}, "must be a mapping with keys"), ({**COST.to_dict(), "weights_s": -1.0}, "weights_s=-1.0"),
     ({**COST.to_dict(), "kv_s_per_token": "1"}, "kv_s_per_token='1'"), ([1, 2], "must be a mapping")],
)
def test_bad_cost_model_is_refused_naming_the_key(value: object, named: str) -> None:
    with pytest.raises(ValueError, match=f"tt.{STEP_COST_KEY}") as error:
        SchedulerOptions.from_additional_config({"tt": {STEP_COST_KEY: value}})
    assert named in str(error.value)


def test_policy_is_chosen_by_the_cost_model() -> None:
    assert isinstance(policy_for(SchedulerOptions()), PhasePolicy)
    chosen = policy_for(SchedulerOptions(prefill_burst=3, step_cost=COST))
    assert isinstance(chosen, CostAwarePolicy) and chosen.prefill_burst == 3 and chosen.cost is COST


@pytest.mark.parametrize(
    ("view", "burst", "expected"),
    [
        (WorkView(decodes=0, partials=0, admissible=0), 0, E),
        (WorkView(decodes=0, partials=0, admissible=1), 0, P),
        (WorkView(decodes=4, partials=0, admissible=0), 0, D),
        # the decode-stall bound stays a hard limit
        (WorkView(decodes=4, partials=1, admissible=0), 2, D),
        (WorkView(decodes=4, partials=0, admissible=3, full=True), 2, D),
        (WorkView(decodes=4, partials=0, admissible=0, must_scan=True), 2, D),
        # otherwise no hold: a prompt waiting costs its time, batching saves none once compute-bound
        (WorkView(decodes=32, partials=0, admissible=1, prompts=(500,)), 0, P),
        (WorkView(decodes=32, partials=0, admissible=1, prompts=(500,)), 1, P),
        (WorkView(decodes=4, partials=1, admissible=0), 1, P),
    ],
)
def test_plan(view: WorkView, burst: int, expected: Phase) -> None:
    assert CostAwarePolicy(COST, prefill_burst=2, burst=burst).plan(view) is expected


@pytest.mark.parametrize(
    ("prompts", "partials", "burst", "expected"),
    [
        # compute-bound prompts: one step each (the first does not wait for the second's compute)
        ((500, 500), (0, 0), 0, 500),
        # ... even when the next step is a decode: 101 ms of compute > the 40 ms decode it waits
        ((500, 500, 500), (0, 0), 1, 500),
        # stream-bound prompts share the step's floor for free
        ((50, 50, 50), (0, 0), 0, None),
        # 150-token prompts: joining adds 22 ms; alone costs a 40 ms step: split, unless the
        # burst bound puts a decode step before that step of its own
        ((150, 150), (0, 0), 0, 150),
        ((150, 150), (0, 0), 1, None),
        # a partial chunk in flight: a long prompt would delay its last chunk
        ((500,), (1, 300), 0, 300),
        ((500, 500), (1, 300), 0, 300),
        ((20,), (1, 20), 0, None),
        # a single admission: the plan's budget stands
        ((500,), (0, 0), 0, None),
    ],
)
def test_how_many_prompts_share_a_prefill_step(
    prompts: tuple[int, ...], partials: tuple[int, int], burst: int, expected: int | None
) -> None:
    view = WorkView(decodes=8, partials=partials[0], admissible=len(prompts), partial_tokens=partials[1],
                    prompts=prompts)
    assert CostAwarePolicy(COST, prefill_burst=2, burst=burst).prefill_tokens(view) == expected


def test_observe_counts_prefill_steps_that_stalled_decodes() -> None:
    policy = CostAwarePolicy(COST, prefill_burst=2)
    waiting = WorkView(decodes=4, partials=0, admissible=2, context=10_000)
    policy.observe(P, waiting)
    policy.observe(P, waiting)
    assert policy.burst == 2
    policy.observe(E, waiting)  # an empty step changes nothing
    assert policy.burst == 2
    policy.observe(D, waiting)
    assert policy.burst == 0
    policy.observe(P, waiting)
    policy.observe(P, WorkView(decodes=0, partials=0, admissible=1))  # nobody stalled
    assert policy.burst == 0


def cost_engine(**config: object) -> Engine:
    tt: dict[str, object] = {}
    record_step_cost(tt, COST)
    return Engine(build_scheduler(TTScheduler, SimConfig(tt=tt, **config)))  # type: ignore[arg-type]


def test_scheduler_splits_compute_bound_prompts_into_steps_within_the_burst_bound() -> None:
    sim = cost_engine(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512)
    assert "cost-aware policy, step cost model: test mesh" in sim.scheduler.policy_summary()
    sim.add(make_request("a", 8, 40))
    sim.run(3)
    for name in ("b", "c", "d"):
        sim.add(make_request(name, 200, 4))
    records = sim.run(200)
    phases = "".join(record.phase_code for record in records[:5])
    # one prompt per prefill step (each 41 ms of compute: compute-bound, so joining a step would
    # only delay the prompt before it), two prefill steps at most before the decode gets its step
    assert phases == "PPDPD", [(r.phase_code, r.scheduled) for r in records[:5]]
    assert [sorted(r.scheduled) for r in records[:2]] == [["b"], ["c"]]
    for name, (prompt, out) in {"a": (8, 40), "b": (200, 4), "c": (200, 4), "d": (200, 4)}.items():
        assert sim.logs[name].tokens == greedy_tokens(name, prompt, out)
        assert sim.logs[name].finishes == 1
