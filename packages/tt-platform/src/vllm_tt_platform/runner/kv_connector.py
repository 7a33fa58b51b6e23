"""``StepConnector``: vLLM's KV connector as the TT runner drives it each step.

vLLM's GPU runner binds the scheduler's connector metadata around its forward, starts the
step's loads (before the forward when a request of the step waits on them), defers the stores
and reports finished transfers in the step's output (``KVConnectorModelRunnerMixin``); the TT
runner does the same through that mixin. ``NO_CONNECTOR`` (no ``--kv-transfer-config`` and no
``--kv-offloading-size``) does nothing. Only connectors with a TT worker side (a
``TTKVHandler``: ``TTOffloadingWorker``, the shared-storage ``ExampleConnector``) reach here
(``startup_checks.check_kv_transfer``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, UniformTypeKVCacheSpecs
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

from vllm_tt_platform.runner.kv_layout import KVLayout
from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages

logger = init_logger("vllm." + __name__)


@runtime_checkable
class TTKVHandler(Protocol):
    """The TT worker side of a served connector: it moves blocks through ``DevicePages``."""

    def attach(self, pages: DevicePages) -> None: ...

    def describe(self) -> str: ...


class StepConnector:
    """No KV connector: every hook is a no-op."""

    active = False

    def register(self, model: Any, kv_cache: Any, layout: KVLayout, config: KVCacheConfig) -> None:
        return None

    def before_step(self, out: SchedulerOutput) -> None:
        return None

    def step(self, out: SchedulerOutput) -> AbstractContextManager[KVConnectorOutput | None]:
        return nullcontext()

    def idle_output(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """The output of a step that scheduled no tokens."""
        return EMPTY_MODEL_RUNNER_OUTPUT


NO_CONNECTOR = StepConnector()


class VLLMStepConnector(StepConnector):
    """vLLM's connector of this worker process (``ensure_kv_transfer_initialized``)."""

    active = True

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.handler: TTKVHandler | None = None

    def register(self, model: Any, kv_cache: Any, layout: KVLayout, config: KVCacheConfig) -> None:
        """Register the cache with vLLM's connector worker and attach the device KV to the TT
        transfer handler it builds. vLLM's connector sizes each layer's page from a byte view
        ``(num_blocks, page bytes)``; the TT cache has none on the host, so it gets views with
        no storage (the ``meta`` device), which the TT handler never reads."""
        connector = get_kv_transfer_group()
        views = {
            name: torch.empty((config.num_blocks, _page_bytes(group.kv_cache_spec, name)), dtype=torch.int8,
                              device="meta")
            for group in config.kv_cache_groups for name in group.layer_names
        }
        connector.register_kv_caches(views)
        handler = _tt_handler(connector)
        handler.attach(DevicePages(model, kv_cache, layout))
        self.handler = handler
        logger.info("%s", handler.describe())

    def before_step(self, out: SchedulerOutput) -> None:
        if out.kv_connector_metadata is not None:
            get_kv_transfer_group().handle_preemptions(out.kv_connector_metadata)

    def step(self, out: SchedulerOutput) -> AbstractContextManager[KVConnectorOutput | None]:
        return _bound(self.vllm_config, out)

    def idle_output(self, out: SchedulerOutput) -> ModelRunnerOutput:
        return KVConnectorModelRunnerMixin.kv_connector_no_forward(out, self.vllm_config)


@contextmanager
def _bound(vllm_config: VllmConfig, out: SchedulerOutput) -> Iterator[KVConnectorOutput | None]:
    """vLLM's forward context plus the mixin's connector lifecycle around one step."""
    with (set_forward_context(None, vllm_config),
          KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(out) as kv_output):
        yield kv_output


def _tt_handler(connector: Any) -> TTKVHandler:
    """The connector itself, or the transfer handler vLLM's offloading worker built from the
    TT spec."""
    offloading = getattr(getattr(connector, "connector_worker", None), "worker", None)
    for candidate in (connector, offloading):
        if isinstance(candidate, TTKVHandler):
            return candidate
    raise RuntimeError(f"{type(connector).__name__} has no TT worker side (got {type(offloading).__name__}); "
                       "the TT platform selects its own for the connectors it serves (config.kv_transfer)")


def _page_bytes(spec: Any, name: str) -> int:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = spec.kv_cache_specs[name]
    return int(spec.page_size_bytes)


def step_connector(vllm_config: VllmConfig) -> StepConnector:
    """The connector of this process, or ``NO_CONNECTOR``."""
    return VLLMStepConnector(vllm_config) if has_kv_transfer_group() else NO_CONNECTOR
