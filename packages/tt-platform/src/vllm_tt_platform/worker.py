"""``TTWorker``: vLLM's worker for one TT engine — opens the mesh through the backend seam and
hosts the model runner."""

from __future__ import annotations

import time
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer import (
    ensure_kv_transfer_initialized,
    ensure_kv_transfer_shutdown,
    get_kv_transfer_group,
    has_kv_transfer_group,
)
from vllm.distributed.parallel_state import (
    ensure_model_parallel_initialized,
    init_distributed_environment,
)
from vllm.logger import init_logger
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from vllm_tt_platform.config import data_parallel
from vllm_tt_platform.config.setup import resolve_setup
from vllm_tt_platform.config.startup_checks import serves_pooling
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.mesh import peer_watch
from vllm_tt_platform.mesh.backend import make_backend
from vllm_tt_platform.runner.model_runner import TTModelRunner
from vllm_tt_platform.runner.pooling import TTPoolingRunner

logger = init_logger("vllm." + __name__)


class TTWorker(WorkerBase):
    def __init__(self, vllm_config: VllmConfig, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.setup = resolve_setup(vllm_config)
        self.backend = make_backend(self.setup.config)
        self.mesh_device: Any = None
        self._runner: TTModelRunner | TTPoolingRunner | None = None

    def init_device(self) -> None:
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0,
            distributed_init_method=self.distributed_init_method, backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
        self.mesh_device = self.backend.open(self.setup.topology.mesh)
        runner_cls = TTPoolingRunner if serves_pooling(self.vllm_config) else TTModelRunner
        self._runner = runner_cls(self.vllm_config, self.setup, self.mesh_device)
        watch = data_parallel.peer_watch(self.vllm_config)
        if watch is not None:
            peer_watch.start(watch)

    @property
    def runner(self) -> TTModelRunner | TTPoolingRunner:
        """The model runner (a pooling model's own one), created when ``init_device`` opens the mesh."""
        if self._runner is None:
            raise RuntimeError("TTWorker.init_device() has not run: there is no model runner yet")
        return self._runner

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        self.runner.load_model()

    def get_model(self) -> Any:
        return self.runner.model

    def get_model_inspection(self) -> str:
        """What ``repr(vllm.LLM)`` prints. vLLM walks a torch module tree; a TT model is not a
        torch module (``print(llm)`` raised), so it is named with its mesh and lanes."""
        model = self.get_model()
        return f"{type(model).__name__} (TT model; {self.setup.topology.describe()})"

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.runner.kv_cache_spec()

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBHNC"]

    def set_kv_cache_layout(self, kv_cache_layout: str, *args: Any) -> None:
        """The model allocates its own KV cache, so the layout does not shape it; it is still
        recorded, because vLLM's grouping of hybrid KV specs (``reserve_kv_blocks``) reads it,
        and in a worker process of its own nothing else records it."""
        super().set_kv_cache_layout(kv_cache_layout, *args)

    def determine_available_memory(self) -> int:
        return self.runner.reserve_kv_blocks()

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        ensure_kv_transfer_initialized(self.vllm_config, kv_cache_config)  # no-op without a KV connector
        self.runner.initialize_kv_cache(kv_cache_config)

    def get_kv_connector_handshake_metadata(self) -> dict[tuple[int, int], Any] | None:
        """What vLLM's KV connector of this worker tells its peers, keyed by (pp rank, tp rank):
        a TT engine is one rank of each."""
        metadata = get_kv_transfer_group().get_handshake_metadata() if has_kv_transfer_group() else None
        return None if metadata is None else {(0, 0): metadata}

    def compile_or_warm_up_model(self) -> CompilationTimes:
        start = time.perf_counter()
        self.runner.warm_up()
        elapsed = time.perf_counter() - start
        self._log_startup_summary(elapsed)
        return CompilationTimes(language_model=elapsed, encoder=0.0)

    def _log_startup_summary(self, warmup_s: float) -> None:
        s = self.setup
        if isinstance(self.runner, TTPoolingRunner):
            logger.info("TT backend: %s backend (%s), %s; model %s from %s; %s; trace_mode=%s; warmup %.1fs; "
                        "options: %s", s.config.mesh_backend, s.config.origin("mesh_backend"), s.topology.describe(),
                        s.model.arch, s.model.source, self.runner.describe(), s.config.trace_mode, warmup_s,
                        s.config.summary())
            return
        logger.info(
            "TT backend: %s backend (%s), %s; model %s from %s; sampling %s; trace_mode=%s; "
            "speculation %s; warmup %.1fs; KV %s blocks/lane of %s tokens; options: %s",
            s.config.mesh_backend, s.config.origin("mesh_backend"), s.topology.describe(), s.model.arch,
            s.model.source,
            f"on device ({s.config.sample_on_device_mode}) with per-batch host fallback"
            if s.config.sample_on_device_mode else "host (vLLM sampler)",
            s.config.trace_mode,
            self.runner.describe_speculation(),
            warmup_s, self.runner.num_blocks, self.runner.block_tokens(),
            s.config.summary(),
        )

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        return self.runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.runner.sample_tokens(grammar_output)

    def get_supported_tasks(self) -> tuple[str, ...]:
        if isinstance(self.runner, TTPoolingRunner):
            return self.runner.supported_tasks()
        return ("generate",)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        return self.runner.take_draft_token_ids()

    def sleep(self, level: int = 1) -> None:
        """``POST /sleep`` (dev mode) with level >= 1: vLLM would release the weights and KV cache,
        which on TT live on the mesh, in the model's own buffers."""
        raise TTUnsupportedFeatureError(
            "POST /sleep level", level, "0 (pause scheduling only; nothing leaves the mesh)",
            "use /sleep?level=0 and /wake_up?tags=scheduling, or restart the server to free the mesh",
        )

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise TTUnsupportedFeatureError(
            "POST /wake_up tags", tags, "scheduling (only level-0 sleep exists on TT)",
            "use /wake_up?tags=scheduling",
        )

    def check_health(self) -> None:
        if self.mesh_device is None:
            raise RuntimeError("the TT mesh is not open")

    def update_max_model_len(self, max_model_len: int) -> None:
        self.vllm_config.model_config.max_model_len = max_model_len
        self.runner.update_max_model_len(max_model_len)

    def shutdown(self) -> None:
        if self._runner is not None:
            self._runner.close()
        ensure_kv_transfer_shutdown()
        if self.mesh_device is not None:
            self.backend.close(self.mesh_device)
            self.mesh_device = None
