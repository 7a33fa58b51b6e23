"""Randomized state machine: the phase scheduler under random load, >= 10,000 steps.

Each example draws an engine (slots, step budget, KV pool small enough to force
preemption, prefill trace cap, prefix caching, policy knobs) and a seed for the event
stream (arrivals with random lengths, structured-output requests whose grammar compiles
late or fails, aborts at any moment), runs ``STEPS_PER_EXAMPLE`` engine steps, then
drains. Checked at every step: no mixed step (but for the ``mixed`` target, a model running
them: one prompt chunk beside decodes), the scheduler's phase is the runner's,
progress whenever work is ready (no livelock), KV blocks within the pool. At the end:
every request finished or was aborted exactly once, every finished id reached the
runner, and every completed output is exactly the never-preempted greedy output.

The scheduler under test comes from ``TARGETS``: a lane coordinator (N lanes) can be
added there later and the whole test re-runs against it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm_tt_scheduler import DEFAULT_PREFILL_BURST, Phase, TTAsyncScheduler, TTScheduler
from vllm_tt_scheduler.cost import STEP_COST_KEY, RooflineStepCost
from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler, greedy_tokens, make_request

STEPS_PER_EXAMPLE = 400
EXAMPLES_PER_TARGET = 13  # 4 targets x 13 x 400 = 20,800 steps, plus the drains
MAX_IDLE_STEPS_WITH_READY_WORK = 2
MAX_MODEL_LEN = 128
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Target:
    """How to build the scheduler under test and reach its KV pools."""

    build: Callable[[SimConfig], object]
    async_depth: int
    kv_managers: Callable[[object], list[object]]
    exact_burst: bool
    """Whether every running decode can always be scheduled (not under async
    scheduling, where a request whose last token is in flight cannot), so that
    the prefill burst bound holds exactly."""


# Prompts over ~20 tokens are compute-bound here, so the cost-aware policy both splits and batches.
STEP_COST = RooflineStepCost(program_s=1e-4, weights_s=0.02, kv_s_per_token=1e-6, prefill_s_per_token=1e-3,
                             attention_s_per_token_pair=1e-6)


def with_step_cost(config: SimConfig) -> SimConfig:
    """The engine with a step cost model handed in: the cost-aware policy."""
    return replace(config, tt={**config.tt, STEP_COST_KEY: STEP_COST.to_dict()})


def with_mixed_steps(config: SimConfig) -> SimConfig:
    """A model running mixed steps: chunks of 8, 16 or 32 tokens beside up to 6 decode rows."""
    return replace(config, tt={**config.tt, "_mixed_shapes": [[6, 8], [6, 16], [6, 32]]})


TARGETS = {
    "cost": Target(
        lambda config: build_scheduler(TTScheduler, with_step_cost(config)), 1, lambda s: [s.kv_cache_manager], True
    ),
    "mixed": Target(
        lambda config: build_scheduler(TTScheduler, with_mixed_steps(config)), 1, lambda s: [s.kv_cache_manager], True
    ),
    "sync": Target(
        lambda config: build_scheduler(TTScheduler, config), 1, lambda s: [s.kv_cache_manager], True
    ),
    "async": Target(
        lambda config: build_scheduler(TTAsyncScheduler, config), 2, lambda s: [s.kv_cache_manager], False
    ),
}


@st.composite
def engines(draw: st.DrawFn, async_scheduling: bool) -> SimConfig:
    budget = draw(st.sampled_from([16, 32, 64, 128]))
    cap = draw(st.sampled_from([None, 16, 48]))
    tt: dict[str, object] = {
        "prefill_burst": draw(st.integers(1, 4)),
        "prefill_hold": draw(st.sampled_from([0.0, 0.5, 2.0])),
    }
    threshold = 0
    if cap is not None and cap < budget:
        tt["_prefill_trace_lens"] = [cap // 2, cap]
        threshold = cap
    min_blocks = MAX_MODEL_LEN // BLOCK_SIZE + 1  # one full-length sequence + null block
    return SimConfig(
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        num_blocks=draw(st.integers(min_blocks, 4 * min_blocks)),
        async_scheduling=async_scheduling,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=draw(st.booleans()),
        tt=tt,
    )


@dataclass(frozen=True)
class Load:
    seed: int
    arrival_rate: float
    abort_rate: float
    structured_rate: float


loads = st.builds(
    Load,
    seed=st.integers(0, 2**32 - 1),
    arrival_rate=st.floats(0.02, 0.4),
    abort_rate=st.sampled_from([0.0, 0.01, 0.05]),
    structured_rate=st.sampled_from([0.0, 0.1]),
)


class _Grammar:
    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False


class Run:
    """One example: the engine, its random event stream, and the invariant checks."""

    def __init__(self, target: Target, config: SimConfig, load: Load) -> None:
        self.target = target
        self.config = config
        self.load = load
        self.rng = random.Random(load.seed)
        self.sim = Engine(target.build(config), async_depth=target.async_depth)
        self.lengths: dict[str, tuple[int, int]] = {}
        self.grammars: dict[str, tuple[Future, int, bool]] = {}
        self.idle_with_ready_work = 0
        self.stalling_prefills = 0
        self.next_id = 0

    def arrive(self) -> None:
        rng = self.rng
        max_tokens = rng.randint(1, 40)
        prompt = rng.randint(1, MAX_MODEL_LEN - max_tokens)
        req_id = f"r{self.next_id}"
        self.next_id += 1
        params = None
        structured = rng.random() < self.load.structured_rate
        if structured:
            params = SamplingParams(
                max_tokens=max_tokens,
                ignore_eos=True,
                structured_outputs=StructuredOutputsParams(json={"type": "object"}),
            )
        request = make_request(req_id, prompt, max_tokens, params)
        if structured:
            grammar: Future = Future()
            request.structured_output_request.grammar = grammar
            ready_at = self.sim.step_index + rng.randint(0, 12)
            self.grammars[req_id] = (grammar, ready_at, rng.random() < 0.2)
        self.lengths[req_id] = (prompt, max_tokens)
        self.sim.add(request)

    def compile_grammars(self, everything: bool = False) -> None:
        for req_id, (grammar, ready_at, fails) in list(self.grammars.items()):
            if everything or self.sim.step_index >= ready_at:
                if fails:
                    grammar.set_exception(ValueError("bad schema"))
                else:
                    grammar.set_result(_Grammar())
                del self.grammars[req_id]

    def abort_one(self) -> None:
        live = [req_id for req_id, log in self.sim.logs.items() if not log.finishes]
        if live:
            self.sim.abort([self.rng.choice(live)])

    def step(self) -> None:
        scheduler = self.sim.scheduler
        ready_work = bool(scheduler.running) or any(
            not self._grammar_pending(request) for request in scheduler.waiting
        )
        decodes = {request for request in scheduler.running if not request.is_prefill_chunk}
        record = self.sim.step()
        if record is None:
            return
        assert record.phase is not None  # the strict runner raised on a mixed step already
        assert scheduler.last_phase is record.phase
        if record.phase in (Phase.DECODE, Phase.MIXED):  # a mixed step stalls no decode
            self.stalling_prefills = 0
            STATS["mixed"] += record.phase is Phase.MIXED
        elif record.phase is Phase.PREFILL and decodes.intersection(scheduler.running):
            self.stalling_prefills += 1
            if self.target.exact_burst:
                burst = self.config.tt.get("prefill_burst", DEFAULT_PREFILL_BURST)
                assert self.stalling_prefills <= burst, "decode stall"
        if record.scheduled or not ready_work:
            self.idle_with_ready_work = 0
        else:
            self.idle_with_ready_work += 1
            assert self.idle_with_ready_work <= MAX_IDLE_STEPS_WITH_READY_WORK, "livelock"
        for manager in self.target.kv_managers(scheduler):
            self.check_kv(scheduler, manager)
        kept = getattr(scheduler, "_current_partials", None)  # the phase scheduler's memo
        if kept is not None:
            assert set(kept()) == {request for request in scheduler.running if request.is_prefill_chunk}

    @staticmethod
    def _grammar_pending(request: object) -> bool:
        structured = request.structured_output_request
        return structured is not None and structured.grammar is None

    @staticmethod
    def check_kv(scheduler: object, manager: object) -> None:
        pool = manager.block_pool
        usable = pool.num_gpu_blocks - 1
        free = pool.get_num_free_blocks()
        assert 0 <= free <= usable
        held: set[int] = set()
        for req_id in scheduler.requests:
            for group in manager.get_block_ids(req_id):
                held.update(group)
        held.discard(0)  # vLLM's null block
        assert len(held) <= usable - free

    def run(self) -> None:
        load = self.load
        for _ in range(STEPS_PER_EXAMPLE):
            if self.rng.random() < load.arrival_rate:
                self.arrive()
            if self.rng.random() < load.abort_rate:
                self.abort_one()
            self.compile_grammars()
            self.step()
        self.compile_grammars(everything=True)
        # Generous: ten steps per token still to compute, so only a stall can exhaust it.
        drain_limit = 100 + 10 * sum(
            sum(self.lengths[req_id]) for req_id, log in self.sim.logs.items() if not log.finishes
        )
        for _ in range(drain_limit):
            if not self.sim.has_work():
                break
            self.step()
        assert not self.sim.has_work(), "did not drain"
        self.check_end()

    def check_end(self) -> None:
        sim = self.sim
        for req_id, log in sim.logs.items():
            assert log.finishes == 1, (req_id, log)
            if log.finish_reason in ("abort", "error"):
                continue
            prompt, max_tokens = self.lengths[req_id]
            assert log.tokens == greedy_tokens(req_id, prompt, max_tokens), req_id
        assert not sim.unsent_finished, "finished ids never reached the runner"
        assert not sim.runner.rows, "stale requests left on the runner"
        assert not sim.scheduler.requests
        for manager in self.target.kv_managers(sim.scheduler):
            pool = manager.block_pool
            assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


STATS: dict[str, int] = {"steps": 0, "preemptions": 0, "prefill": 0, "decode": 0, "mixed": 0}


@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_random_load(target_name: str) -> None:
    target = TARGETS[target_name]
    is_async = target.async_depth > 1

    @settings(
        max_examples=EXAMPLES_PER_TARGET,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
        # No shrinking: examples are long; a failure prints its config and load seed,
        # which replay it exactly.
        phases=[HypothesisPhase.explicit, HypothesisPhase.generate],
    )
    @given(config=engines(async_scheduling=is_async), load=loads)
    def check(config: SimConfig, load: Load) -> None:
        run = Run(target, config, load)
        run.run()
        STATS["steps"] += run.sim.step_index

    mixed_before = STATS["mixed"]
    check()
    assert STATS["steps"] >= EXAMPLES_PER_TARGET * STEPS_PER_EXAMPLE
    assert (STATS["mixed"] > mixed_before) is (target_name == "mixed")  # only a mixed model mixes


def test_random_load_exercises_preemption_and_both_phases() -> None:
    """The random engines are small enough that the interesting paths really run."""
    seen = {Phase.PREFILL: 0, Phase.DECODE: 0, "preempted": 0, "retried": 0}
    config = SimConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=MAX_MODEL_LEN, num_blocks=10)
    run = Run(TARGETS["sync"], config, Load(seed=7, arrival_rate=0.5, abort_rate=0.01, structured_rate=0.1))
    original_step = run.sim.step

    def counting_step():  # type: ignore[no-untyped-def]
        record = original_step()
        if record is not None:
            if record.phase in seen:
                seen[record.phase] += 1
            seen["preempted"] += bool(record.preempted)
        return record

    run.sim.step = counting_step  # type: ignore[method-assign]
    run.run()
    assert seen[Phase.PREFILL] and seen[Phase.DECODE] and seen["preempted"]
