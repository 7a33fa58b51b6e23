"""vllm-tt-scheduler: vLLM's scheduler restricted to prefill-only, decode-only, empty (and, for
models that run them, mixed) steps.

``Phase``, ``step_phase``, the options (``USER_OPTIONS``, defaults, ``record_prefill_trace_lens``,
``record_mixed_shapes``)
and the lane contract (``lanes.shape``) import without vLLM; the scheduler classes load vLLM on
first access (vLLM resolves ``scheduler_cls`` by attribute).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_tt_scheduler.options import (
    CONFIG_KEYS,
    DEFAULT_PREFILL_BURST,
    DEFAULT_PREFILL_HOLD,
    USER_OPTIONS,
    OptionSpec,
    SchedulerOptions,
    record_mixed_shapes,
    record_prefill_trace_lens,
)
from vllm_tt_scheduler.phase import MixedStepError, Phase, step_phase

if TYPE_CHECKING:
    from vllm_tt_scheduler.lanes.coordinator import TTLaneCoordinator
    from vllm_tt_scheduler.scheduler import TTAsyncScheduler, TTScheduler

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_PREFILL_BURST",
    "DEFAULT_PREFILL_HOLD",
    "MixedStepError",
    "OptionSpec",
    "Phase",
    "SchedulerOptions",
    "TTAsyncScheduler",
    "TTLaneCoordinator",
    "TTScheduler",
    "USER_OPTIONS",
    "record_mixed_shapes",
    "record_prefill_trace_lens",
    "step_phase",
]

_LAZY = {"TTScheduler": "scheduler", "TTAsyncScheduler": "scheduler", "TTLaneCoordinator": "lanes.coordinator"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"vllm_tt_scheduler.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'vllm_tt_scheduler' has no attribute {name!r}")
