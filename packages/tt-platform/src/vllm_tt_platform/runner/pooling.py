"""``TTPoolingRunner``: serves a pooling model (``pooling_model``) as prefill-only steps.

Every scheduled prompt runs whole in the step that schedules it: the step's prompts are packed
into ``pool_forward`` calls of the captured (batch, length) shapes (``PoolingShapes.plan``),
their hidden states pooled per request (or, for a model with its own head, its logits put
through vLLM's classification activation), and each request finishes with its vector (vLLM's
scheduler stops a pooling request once it has output). No KV cache, no decode, no sampling.

In lanes a call runs its shape on every lane's sub-mesh at once (one program over the mesh).
A pooling prompt keeps nothing on its lane, so the lanes' schedulers only bound how many
prompts a step takes (``--max-num-seqs`` per lane); the runner packs the whole step's prompts
over all sub-meshes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm_tt_models_registry.contract import TTModel, TTModelExtras

from vllm_tt_platform.config.pooling_shapes import PoolCall, PoolTiming, pooling_shapes_of
from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.runner.device_watch import DeviceWatch
from vllm_tt_platform.runner.pooler import ClassifierHead, SequencePooler
from vllm_tt_platform.runner.warmup_report import WarmupReport

logger = init_logger("vllm." + __name__)


@dataclass(frozen=True)
class _Prompt:
    req_id: str
    token_ids: list[int]
    params: Any
    """The request's ``PoolingParams``."""

    @property
    def second_text(self) -> tuple[int, int] | None:
        """A text pair's positions of token type 1 (vLLM's score path sends them compressed)."""
        extra = getattr(self.params, "extra_kwargs", None) or {}
        span = extra.get("compressed_token_type_ids")
        return None if span is None else (int(span[0]), int(span[1]))


class TTPoolingRunner:
    def __init__(self, vllm_config: VllmConfig, setup: TTSetup, mesh_device: Any) -> None:
        self.vllm_config = vllm_config
        self.setup = setup
        self.mesh_device = mesh_device
        self.model_config = vllm_config.model_config
        self.max_model_len = self.model_config.max_model_len
        self.shapes = pooling_shapes_of(vllm_config, setup.config.pooling_shapes)
        self.lanes = setup.topology.lanes
        self.timing = PoolTiming.served(self.model_config.hf_config, setup.topology.mesh, self.lanes)
        self.pooled_outputs = setup.capabilities.pooled_outputs
        self.pooler: SequencePooler | ClassifierHead = (
            ClassifierHead(self.model_config) if self.pooled_outputs else SequencePooler.of(self.model_config)
        )
        self.trace = setup.config.trace_mode == "all"
        self.device_watch = DeviceWatch(setup.config.readback_timeout_s)
        self._model: TTModel | None = None
        self._prompts: dict[str, _Prompt] = {}

    # -- setup -------------------------------------------------------------------------------
    def load_model(self) -> None:
        model_cls = cast("type[TTModel]", self.setup.model.load_class())
        self._model = model_cls.initialize_vllm_model(
            self.model_config.hf_config, self.mesh_device, self.lanes * max(s.batch for s in self.shapes.shapes),
            max_seq_len=self.max_model_len, tt_data_parallel=self.lanes, optimizations=self.setup.config.optimizations,
        )

    @property
    def model(self) -> TTModel:
        if self._model is None:
            raise RuntimeError("TTPoolingRunner.load_model() has not run: there is no model yet")
        return self._model

    def supported_tasks(self) -> tuple[str, ...]:
        return self.pooler.tasks

    def kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """None: an encoder keeps no KV cache (vLLM then treats the model as attention-free)."""
        return {}

    def reserve_kv_blocks(self) -> int:
        return 0

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Nothing to allocate."""

    def update_max_model_len(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    def warm_up(self) -> None:
        """Compile every pooling shape, then capture their traces (``trace_mode all``)."""
        if not self.setup.config.enable_model_warmup:
            return
        warm = getattr(self.model, "warmup_model_pool", None)
        if warm is None:
            raise TypeError(
                f"{type(self.model).__qualname__} has no warmup_model_pool(); implement it or set "
                "--additional-config.tt.enable_model_warmup false (with trace_mode none)"
            )
        shapes = [(s.batch, s.length) for s in self.shapes.shapes]
        report = WarmupReport()
        for enable_trace in (False, True) if self.trace else (False,):
            with report.timed(f"pooling {'trace capture' if enable_trace else 'compile'} "
                              f"({len(shapes)} shapes: {self.shapes.describe()})"):
                warm(shapes=shapes, enable_trace=enable_trace)
        report.log_summary()

    def describe(self) -> str:
        """The startup summary's pooling part."""
        packing = (f"calls packed by modelled time ({self.timing.costs.description})" if self.timing is not None
                   else "calls packed fewest first (no cost model of the checkpoint)")
        where = (f" on each of {self.lanes} lanes' sub-meshes side by side (a call pools up to {self.lanes}x its "
                 "batch)" if self.lanes > 1 else "")
        return (f"pooling model ({self.pooler.kind} pooling, tasks {', '.join(self.pooler.tasks)}), no KV cache; "
                f"programs at {len(self.shapes.shapes)} shapes (BATCHxLENGTH){where}: {self.shapes.describe()}; "
                f"{packing}")

    # -- steps -------------------------------------------------------------------------------
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Pool every scheduled prompt. The output is returned here, not from ``sample_tokens``:
        vLLM runs pooling models without async scheduling, and there is nothing to sample."""
        for new in out.scheduled_new_reqs:
            if new.pooling_params is None or new.prompt_token_ids is None:
                raise TTUnsupportedFeatureError(
                    "request", new.req_id, "a pooling request with prompt token ids",
                    "send embedding requests to a pooling model",
                )
            self._prompts[new.req_id] = _Prompt(new.req_id, list(new.prompt_token_ids), new.pooling_params)
        for req_id in out.finished_req_ids:
            self._prompts.pop(req_id, None)
        if out.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        prompts = [self._take(req_id, count) for req_id, count in out.num_scheduled_tokens.items()]
        vectors: list[torch.Tensor | None] = [None] * len(prompts)
        program_s = None if self.timing is None else self.timing.program_s
        for call in self.shapes.plan([len(p.token_ids) for p in prompts], program_s, self.lanes):
            hidden = self._run(call, prompts)
            for j, i in enumerate(call.rows):
                slot = call.slot(j)
                row = hidden[slot] if self.pooled_outputs else hidden[slot, : len(prompts[i].token_ids)]
                vectors[i] = self.pooler.pool(row, prompts[i].params)
        req_ids = [p.req_id for p in prompts]
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 pooler_output=vectors)

    def _take(self, req_id: str, scheduled: int) -> _Prompt:
        prompt = self._prompts.pop(req_id)
        if scheduled != len(prompt.token_ids):
            raise RuntimeError(
                f"request {req_id} was scheduled {scheduled} of its {len(prompt.token_ids)} prompt tokens; "
                "a pooling prompt runs whole (chunked prefill must be off for pooling models)"
            )
        return prompt

    def _run(self, call: PoolCall, prompts: list[_Prompt]) -> torch.Tensor:
        """One ``pool_forward`` at ``call.shape`` on every lane; slots without a prompt are
        padding (length 0)."""
        tokens = torch.zeros((call.batch, call.shape.length), dtype=torch.int64)
        lens = torch.zeros(call.batch, dtype=torch.int64)
        types = torch.zeros_like(tokens)
        for j, i in enumerate(call.rows):
            ids, slot = prompts[i].token_ids, call.slot(j)
            tokens[slot, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
            lens[slot] = len(ids)
            if (span := prompts[i].second_text) is not None:
                types[slot, span[0]: span[1]] = 1
        pairs = {"token_type_ids": types} if any(prompts[i].second_text for i in call.rows) else {}
        with self.device_watch.call("pooling step"):
            raw = cast(TTModelExtras, self.model).pool_forward(tokens=tokens, prompt_lens=lens,
                                                               enable_trace=self.trace, **pairs)
            return torch.as_tensor(raw, dtype=torch.float32)

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput:
        return EMPTY_MODEL_RUNNER_OUTPUT

    def take_draft_token_ids(self) -> None:
        return None

    def close(self) -> None:
        """Nothing held beyond the model, which the mesh owns."""

