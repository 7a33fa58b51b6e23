"""The randomized state machine of ``test_sched_state_machine``, against the lane coordinator.

Same engines (each lane gets the drawn slots and KV pool), same random loads, same checks: no
mixed step, the coordinator's phase is the runner's, the decode-stall bound, no livelock, every
KV pool consistent, every request finished exactly once with its never-preempted greedy output.
On top, every step the runner checks the lane contract: block ids carry the lane that holds the
request, a lane never has more rows scheduled than it owns, and a request never changes lane
(preempted or not).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as HypothesisPhase
from vllm.v1.core.sched.output import SchedulerOutput
from vllm_tt_scheduler import TTLaneCoordinator
from vllm_tt_testing.scheduler_sim import FakeRunner, SimConfig, build_scheduler


def _load_machine():  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name("test_sched_state_machine.py")
    spec = importlib.util.spec_from_file_location("vllm_tt_scheduler_tests_state_machine", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


machine = _load_machine()

EXAMPLES_PER_TARGET = 5  # 4 targets x 5 x 400 = 8,000 steps, plus the drains


def with_lanes(config: SimConfig, lanes: int) -> SimConfig:
    """The drawn engine as ``lanes`` lanes of its slots and KV pool each."""
    rows = config.max_num_seqs
    return replace(config, max_num_seqs=lanes * rows, tt={**config.tt, "_lanes": lanes, "_rows_per_lane": rows})


class LaneContractError(AssertionError):
    pass


class LaneCheckingRunner(FakeRunner):
    """The fake runner, checking each step against the lane contract first."""

    def __init__(self, coordinator: TTLaneCoordinator) -> None:
        super().__init__(strict=True)
        self.coordinator = coordinator
        self.home: dict[str, int] = {}
        self.rows_scheduled = 0

    def execute(self, out: SchedulerOutput):  # type: ignore[no-untyped-def]
        coordinator = self.coordinator
        numbering = coordinator.numbering
        per_lane = [0] * len(coordinator.lanes)
        for req_id in out.num_scheduled_tokens:
            lane = coordinator.lane_of(req_id)
            if lane is None or self.home.setdefault(req_id, lane) != lane:
                raise LaneContractError(f"{req_id} moved from lane {self.home.get(req_id)} to {lane}")
            per_lane[lane] += 1
        if max(per_lane) > coordinator.shape.rows_per_lane:
            raise LaneContractError(f"rows per lane {per_lane} > {coordinator.shape.rows_per_lane}")
        cached = out.scheduled_cached_reqs
        owned = [(new.req_id, new.block_ids) for new in out.scheduled_new_reqs]
        owned += [(req_id, ids) for req_id, ids in zip(cached.req_ids, cached.new_block_ids, strict=True) if ids]
        for req_id, groups in owned:
            lanes = {numbering.lane_of(block) for group in groups for block in group}
            if lanes and lanes != {self.home[req_id]}:
                raise LaneContractError(f"{req_id} (lane {self.home[req_id]}) got blocks of lanes {lanes}")
        self.rows_scheduled += len(out.num_scheduled_tokens)
        return super().execute(out)


class LaneRun(machine.Run):
    def __init__(self, target, config, load) -> None:  # type: ignore[no-untyped-def]
        super().__init__(target, config, load)
        self.sim.runner = LaneCheckingRunner(self.sim.scheduler)

    @staticmethod
    def check_kv(scheduler, manager) -> None:  # type: ignore[no-untyped-def]
        lane = next(lane for lane in scheduler.lanes if lane.kv_cache_manager is manager)
        machine.Run.check_kv(lane, manager)


def _target(lanes: int, is_async: bool):  # type: ignore[no-untyped-def]
    return machine.Target(
        lambda config: build_scheduler(TTLaneCoordinator, config),
        2 if is_async else 1,
        lambda coordinator: [lane.kv_cache_manager for lane in coordinator.lanes],
        not is_async,
    )


TARGETS = {
    f"{lanes}-lanes-{mode}": (lanes, mode == "async") for lanes in (2, 4) for mode in ("sync", "async")
}


@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_random_load_with_lanes(target_name: str) -> None:
    lanes, is_async = TARGETS[target_name]
    target = _target(lanes, is_async)
    steps = {"total": 0, "rows": 0}

    @settings(
        max_examples=EXAMPLES_PER_TARGET,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
        phases=[HypothesisPhase.explicit, HypothesisPhase.generate],
    )
    @given(config=machine.engines(async_scheduling=is_async), load=machine.loads)
    def check(config: SimConfig, load) -> None:  # type: ignore[no-untyped-def]
        run = LaneRun(target, with_lanes(config, lanes), load)
        run.run()
        steps["total"] += run.sim.step_index
        steps["rows"] += run.sim.runner.rows_scheduled

    check()
    assert steps["total"] >= EXAMPLES_PER_TARGET * machine.STEPS_PER_EXAMPLE
    assert steps["rows"] > steps["total"]  # lanes really ran side by side
