"""The runner's side of the TT metrics (``vllm_tt_platform.metrics``): what one step reports.

Kept out of ``model_runner``: the runner calls ``open_runner_metrics`` once and ``record`` per
step that runs the model; with metrics off both cost nothing (the null object).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.config import VllmConfig
from vllm_tt_sampling.decision import SamplingDecision

from vllm_tt_platform.metrics.engine import OverlapCounts, StepMetrics, open_step_metrics
from vllm_tt_platform.runner.batch import PersistentBatch
from vllm_tt_platform.runner.step import StepPlan


def open_runner_metrics(vllm_config: VllmConfig, batch: PersistentBatch, overlap: OverlapCounts,
                        mesh_device: Any) -> StepMetrics:
    def lane_rows_used() -> list[int]:
        used = [0] * batch.lanes
        for state in list(batch.requests.values()):  # copied: read from the metrics thread
            used[batch.lane_of_slot(state.slot)] += 1
        return used

    device_seconds: Callable[[], float] | None = None
    # An optional mesh-device member: the host backend models device time; a ttnn mesh has none.
    if getattr(mesh_device, "modelled_device_seconds", None) is not None:
        def device_seconds() -> float:
            return float(mesh_device.modelled_device_seconds)

    return open_step_metrics(
        vllm_config.parallel_config.data_parallel_rank, rows_per_lane=batch.rows_per_lane,
        lane_rows_used=lane_rows_used, overlap=overlap, device_seconds=device_seconds,
    )


def record(metrics: StepMetrics, plan: StepPlan, decision: SamplingDecision, batch_rows: int) -> None:
    metrics.step(
        plan.phase.value, tokens=sum(r.num_scheduled for r in plan.rows), rows_used=len(plan.rows),
        rows=batch_rows, sampling=f"{decision.path.value}:{decision.reason}",
    )
