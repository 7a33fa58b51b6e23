"""``TTModelRunner``: turns scheduler outputs into fixed-shape model calls through the TT model
contract, and model results into ``ModelRunnerOutput``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never, cast

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    AsyncModelRunnerOutput,
    DraftTokenIds,
    KVConnectorOutput,
    ModelRunnerOutput,
)
from vllm_tt_models_registry.contract import BLOCK_KWARG, TTModel, TTModelExtras
from vllm_tt_sampling.decision import DeviceSamplingMode
from vllm_tt_scheduler.lanes.shape import BlockNumbering
from vllm_tt_scheduler.phase import Phase

from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.runner import mm_inputs, model_output, step_metrics
from vllm_tt_platform.runner.async_decode import InFlightStep, overlap_for
from vllm_tt_platform.runner.batch import PersistentBatch
from vllm_tt_platform.runner.block_output import BlockOutput
from vllm_tt_platform.runner.call_builder import StepCalls
from vllm_tt_platform.runner.device_watch import DeviceWatch
from vllm_tt_platform.runner.draft_model import DraftModel
from vllm_tt_platform.runner.drafters import Drafter, NgramDrafts, PagedDrafter
from vllm_tt_platform.runner.eagle3 import Eagle3Drafts
from vllm_tt_platform.runner.kv_budget import KVBudget
from vllm_tt_platform.runner.kv_cache import RunnerKV
from vllm_tt_platform.runner.kv_connector import NO_CONNECTOR, StepConnector, step_connector
from vllm_tt_platform.runner.model_drafts import ModelDrafts
from vllm_tt_platform.runner.mtp import MtpDrafts
from vllm_tt_platform.runner.sampling.inputs import DeviceSampling
from vllm_tt_platform.runner.sampling.step_sampling import StepSampling
from vllm_tt_platform.runner.speculative import SpecSettings, Speculation
from vllm_tt_platform.runner.step import StepPlan
from vllm_tt_platform.runner.step_results import (
    BlockResult,
    DecodeResult,
    MixedResult,
    PrefillResult,
    StepResult,
    VerifyResult,
    committed_output,
)
from vllm_tt_platform.runner.warmup_report import WarmupReport

logger = init_logger("vllm." + __name__)


@dataclass(frozen=True)
class _PendingStep:
    """What ``execute_model`` leaves for ``sample_tokens``."""

    plan: StepPlan
    result: StepResult
    kv_transfers: KVConnectorOutput | None = None
    """What vLLM's KV connector reported for the step (``--kv-offloading-size``)."""


def _not_run(call: str, what: str) -> RuntimeError:
    return RuntimeError(f"TTModelRunner.{call}() has not run: there is no {what} yet")


class TTModelRunner:
    def __init__(self, vllm_config: VllmConfig, setup: TTSetup, mesh_device: Any) -> None:
        self.vllm_config = vllm_config
        self.setup = setup
        self.mesh_device = mesh_device
        self.model_config = vllm_config.model_config
        self.hf_config = self.model_config.hf_text_config
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.topology = setup.topology
        self.batch = PersistentBatch(self.topology.lanes, self.topology.rows_per_lane)
        self.kv = RunnerKV(vllm_config, self.topology)
        self.table_width = self.kv.table_width(self.max_model_len)
        config = setup.config
        self.uses_mrope = bool(self.model_config.uses_mrope)
        """Prefill returns ``(out, rope_deltas)``; decode is sent ``rope_deltas_all_users``."""
        self.prefill_trace = config.trace_mode == "all"
        self.decode_trace = config.trace_mode in ("all", "decode_only")
        self.sampling = StepSampling(vllm_config, setup)
        # Set by load_model() and initialize_kv_cache(); read through the properties below.
        self._model_cls: type[TTModel] | None = None
        self._model: TTModel | None = None
        self._num_blocks: int | None = None
        self._kv_cache: Any = None
        """Opaque to the runner: whatever the model's ``allocate_kv_cache`` returned."""
        self._pending: _PendingStep | None = None
        self.spec_settings = SpecSettings.of(vllm_config)
        self._spec: Speculation | None = None
        """Set by ``load_model`` when ``--speculative-config`` is given."""
        self._paged_drafter: PagedDrafter | None = None
        """``method: draft_model`` (the drafter checkpoint on the mesh), ``mtp`` (the model's
        MTP module) or ``eagle3`` (an EAGLE-3 head beside the model): a drafter with KV pages of
        its own, one per target block."""
        self.mixed_shapes = setup.capabilities.mixed_shapes if config.mixed_steps else ()
        """The mixed programs the model runs (``tt.mixed_steps``); empty: phase-pure steps only."""
        self.blocks = BlockOutput(config.block_tokens, self.max_model_len) if config.block_tokens > 1 else None
        """Adaptive block output (``tt.block_tokens``): decode steps may commit blocks."""
        self.device_watch = DeviceWatch(config.readback_timeout_s)
        self.connector: StepConnector = NO_CONNECTOR
        """vLLM's KV connector (KV offloading), set by ``initialize_kv_cache``."""
        self.overlap = overlap_for(
            # A KV connector reports every step's transfers in that step's output.
            async_scheduling=bool(vllm_config.scheduler_config.async_scheduling) and vllm_config.kv_transfer_config is None,
            supports_async_decode=setup.capabilities.supports_async_decode, decode_trace=self.decode_trace,
            sampling=self.sampling.steady,
            mesh_device=mesh_device, watch=self.device_watch,
        )
        self.metrics = step_metrics.open_runner_metrics(vllm_config, self.batch, self.overlap.stats, mesh_device)

    # -- setup -------------------------------------------------------------------------------
    def load_model(self) -> None:
        # load_class() checked the class against the contract (the registry's check_model_class).
        model_cls = cast("type[TTModel]", self.setup.model.load_class())
        self._model_cls = model_cls
        self._model = model_cls.initialize_vllm_model(
            self.model_config.hf_config,
            self.mesh_device,
            self.topology.decode_rows,
            max_seq_len=self.max_model_len,
            tt_data_parallel=self.topology.lanes,
            optimizations=self.setup.config.optimizations,
        )
        self.sampling.open_host_sampler(self.batch.num_slots)
        if self.spec_settings is not None:
            drafter: Drafter
            if self.spec_settings.method == "mtp":
                # The module's block is an attention layer of the target's shape (a hybrid
                # model's first layers may hold a recurrent state).
                layer_spec = next((s for s in self.kv.spec(model_cls).values() if isinstance(s, AttentionSpec)), None)
                if layer_spec is None:
                    raise TypeError(f"{model_cls.__qualname__}: no attention layer in its KV cache spec")
                drafter = self._paged_drafter = MtpDrafts(self.vllm_config, self._model, layer_spec,
                                                          self.spec_settings.num_tokens, self.batch.num_slots,
                                                          lambda: self.kv.planned)
            elif self.spec_settings.method == "eagle3":
                drafter = self._paged_drafter = Eagle3Drafts(self.vllm_config, self._model, self.spec_settings.num_tokens,
                                                             self.batch.num_slots)
            elif self.spec_settings.method == "custom_class":  # startup checks: the model's own drafter
                drafter = ModelDrafts(self.vllm_config, self._model, self.spec_settings.num_tokens, self._calls)
            elif self.spec_settings.method == "draft_model":
                drafter = self._paged_drafter = DraftModel(self.vllm_config, self.setup, self.mesh_device,
                                                         self.spec_settings.num_tokens)
            else:
                drafter = NgramDrafts(self.vllm_config, self.spec_settings.num_tokens, self.batch.num_slots)
            self._spec = Speculation(self.vllm_config, self.spec_settings, drafter, self.sampling.host_sampler)

    @property
    def model_cls(self) -> type[TTModel]:
        """The contract class serving the model, resolved by ``load_model``."""
        if self._model_cls is None:
            raise _not_run("load_model", "model class")
        return self._model_cls

    @property
    def model(self) -> TTModel:
        """The model instance, built by ``load_model``."""
        if self._model is None:
            raise _not_run("load_model", "model")
        return self._model

    @property
    def speculation(self) -> Speculation:
        """Speculative decoding, set up by ``load_model`` when ``--speculative-config`` is given."""
        if self._spec is None:
            raise RuntimeError("TTModelRunner has no speculative decoding: --speculative-config is not set")
        return self._spec

    @property
    def num_blocks(self) -> int:
        """KV blocks per lane, fixed by ``initialize_kv_cache``."""
        if self._num_blocks is None:
            raise _not_run("initialize_kv_cache", "KV cache")
        return self._num_blocks

    def block_tokens(self) -> str:
        """Tokens per KV block, per group kind when vLLM gave the groups different sizes."""
        planned = self.kv.planned
        return str(self.block_size) if planned is None else planned.block_tokens()

    @property
    def kv_cache(self) -> Any:
        """The model's KV cache, allocated by ``initialize_kv_cache``."""
        if self._num_blocks is None:
            raise _not_run("initialize_kv_cache", "KV cache")
        return self._kv_cache

    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    def kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.kv.spec(self.model_cls)

    def kv_budget(self) -> KVBudget:
        """KV blocks per lane, per KV cache group (``RunnerKV.budget``)."""
        return self.kv.budget(self.model_cls)

    def kv_blocks_wanted(self) -> int:
        return self.kv_budget().blocks

    def kv_cache_bytes(self) -> int:
        budget = self.kv_budget()
        return budget.bytes + budget.blocks * self._drafter_bytes_per_block()

    def reserve_kv_blocks(self) -> int:
        """``determine_available_memory``: fix vLLM's block count to the budget; its bytes (a
        drafter model's pages included: one per block, in the same budget)."""
        target_bytes = self.kv.reserve(self.model_cls)
        return target_bytes + self.kv_budget().blocks * self._drafter_bytes_per_block()

    def _drafter_bytes_per_block(self) -> int:
        return self._paged_drafter.bytes_per_block if self._paged_drafter is not None else 0

    def describe_speculation(self) -> str:
        """The startup summary's speculation part: method, K, verify shape, drafter and its KV;
        or the model's own block output."""
        if self.blocks is not None:
            return self.blocks.describe(self.topology.rows_per_lane)
        if self.spec_settings is None:
            return "off"
        topology = self.topology
        drafter = ""
        if self._paged_drafter is not None:
            drafter = self._paged_drafter.describe(self._num_blocks)
        elif self._spec is not None and isinstance(self._spec.drafter, ModelDrafts):
            drafter = self._spec.drafter.describe()
        return self.spec_settings.describe(topology.lanes, topology.rows_per_lane,
                                           device_sampling=bool(self.setup.config.sample_on_device_mode),
                                           drafter=drafter)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        self._num_blocks = kv_cache_config.num_blocks
        self.table_width = self.kv.table_width(self.max_model_len, self.num_blocks)
        self._kv_cache = self.kv.allocate(self.model, self.model_cls, kv_cache_config)
        if self._paged_drafter is not None:
            self._paged_drafter.allocate(self.num_blocks, self.table_width, self.kv.heads_per_device)
        self.connector = step_connector(self.vllm_config)
        if self.kv.planned is not None:
            self.connector.register(self.model, self._kv_cache, self.kv.planned, kv_cache_config)

    def update_max_model_len(self, max_model_len: int) -> None:
        """vLLM shortened ``max_model_len`` to fit the KV cache: narrow the block tables."""
        self.max_model_len = max_model_len
        self.table_width = self.kv.table_width(max_model_len, self.kv.num_blocks)
        if self._paged_drafter is not None:
            self._paged_drafter.narrow(max_model_len, self.table_width)

    def warm_up(self) -> None:
        """Compile every program, then capture the traces the trace mode asks for."""
        if not self.setup.config.enable_model_warmup:
            return
        model = self.model
        for name in ("warmup_model_prefill", "warmup_model_decode"):
            if not hasattr(model, name):
                raise TypeError(
                    f"{type(model).__qualname__} has no {name}(); implement it or set "
                    "--additional-config.tt.enable_model_warmup false (with trace_mode none)"
                )
        warm = cast(TTModelExtras, model)  # both optional warmup members are present (checked above)
        mode = self.sampling.mode
        report = WarmupReport()
        for prefill_trace, decode_trace in ((False, False), (self.prefill_trace, self.decode_trace)):
            if hasattr(model, "already_warmed_up_prefill"):  # tt-metal's once-only prefill warmup flag
                model.already_warmed_up_prefill = False
            with report.timed(f"prefill {'trace capture' if prefill_trace else 'compile'} "
                              f"(prompts up to {self.max_model_len} tokens)"):
                warm.warmup_model_prefill(
                    kv_cache=self.kv_cache, enable_trace=prefill_trace,
                    can_sample_on_device=mode is DeviceSamplingMode.ALL,
                )
            with report.timed(f"decode {'trace capture' if decode_trace else 'compile'} "
                              f"({self.topology.decode_rows} rows x {self.table_width} blocks)"):
                warm.warmup_model_decode(
                    kv_cache=self.kv_cache, enable_trace=decode_trace,
                    max_batch_size=self.topology.decode_rows, num_blocks=self.table_width,
                    can_sample_on_device=mode is not None,
                    **(self._spec.warmup_kwargs() if self._spec is not None else {}),
                    **({BLOCK_KWARG: self.blocks.block_tokens} if self.blocks is not None else {}),
                    **({"mixed_shapes": list(self.mixed_shapes)} if self.mixed_shapes else {}),
                )
        report.log_summary()

    # -- steps -------------------------------------------------------------------------------
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput | None:
        self.overlap.begin_step(out, self.batch)  # applies or drains steps in flight
        added, resumed, released = self.batch.update(out, self._lanes_of_new(out))
        if added or resumed or released:
            self.overlap.batch_changed()
        self.sampling.track(out, added, resumed, released)
        if self._spec is not None and released:
            self._spec.released(released)
        self.connector.before_step(out)
        if out.total_num_scheduled_tokens == 0:
            return self.connector.idle_output(out)
        with self.connector.step(out) as kv_transfers:
            self._pending = self._run_step(out, kv_transfers)
        return None

    def _run_step(self, out: SchedulerOutput, kv_transfers: KVConnectorOutput | None) -> _PendingStep:
        plan = StepPlan.build(out, self.batch, mixed=bool(self.mixed_shapes))
        drafts = self._spec.step_drafts(out, plan) if self._spec is not None else {}
        limits = None
        if self.blocks is not None and plan.phase is Phase.DECODE:
            limits = self.blocks.limits(plan, self.sampling.row_sampling(plan))
        decision = self.sampling.decide(plan, verify=bool(drafts))
        step_metrics.record(self.metrics, plan, decision, self.batch.num_slots)
        calls = self._calls()
        sampling = calls.sampling(plan, decision)
        result: StepResult
        if plan.phase is Phase.PREFILL:
            result = self._prefill(calls, plan, sampling)
        elif plan.phase is Phase.MIXED:
            result = self._mixed(calls, plan)
        elif drafts:
            result = self._verify(calls, plan, sampling, drafts)
        elif limits is not None:
            result = self._block(calls, plan, limits)
        else:
            result = self._decode(calls, plan, sampling)
        return _PendingStep(plan, result, kv_transfers)

    def _lanes_of_new(self, out: SchedulerOutput) -> dict[str, int]:
        """Lane of each new request, read from its first block id (lane-numbered blocks)."""
        if self.topology.lanes == 1:
            return {}
        numbering = BlockNumbering(self.num_blocks)
        return {new.req_id: numbering.lane_of(new.block_ids[0][0]) for new in out.scheduled_new_reqs}

    def _calls(self) -> StepCalls:
        """The builder of this step's device call, over the current KV cache and table width."""
        return StepCalls(
            kv_cache=self.kv_cache, table_width=self.table_width, blocks_per_lane=self.num_blocks,
            layout=self.kv.layout, num_slots=self.batch.num_slots, vocab_size=self.sampling.vocab_size,
            prefill_trace=self.prefill_trace, decode_trace=self.decode_trace, uses_mrope=self.uses_mrope,
        )

    # One method per step kind: build the call, then run it. Only the device call and reading its
    # output are the device's (a failure there is one TTDeviceError); building the call is host
    # work and fails as itself.
    def _prefill(self, calls: StepCalls, plan: StepPlan, sampling: DeviceSampling | None) -> PrefillResult:
        call = calls.prefill(plan, sampling, prompt_logprobs=self.sampling.prompt_logprobs_wanted(plan))
        with self.device_watch.call("prefill step"):
            raw = self.model.prefill_forward(**call.to_contract_kwargs())
            if self.uses_mrope:
                raw, rope_deltas = raw
                mm_inputs.record_rope_deltas([r.state for r in plan.rows], rope_deltas)
            if call.return_all_logits:
                self.sampling.collect_prompt_logprobs(plan, raw)
            return PrefillResult(model_output.parse(raw, sampled_on_device=call.sampling is not None,
                                                    owner=f"{type(self.model).__qualname__}.prefill_forward"))

    def _decode(self, calls: StepCalls, plan: StepPlan, sampling: DeviceSampling | None) -> DecodeResult | InFlightStep:
        on_device = sampling is not None
        overlapped = self.overlap.prepare_decode(  # drains what is in flight unless overlapped
            self.batch, device_sampled=on_device, penalties=sampling is not None and sampling.penalties,
            logprobs=sampling is not None and sampling.logprobs,
        )
        # Built once the drain has brought the host state up to date.
        call = calls.decode(plan, sampling, reset_batch=self.overlap.reset_batch(plan.rows, device_sampled=on_device))
        num_slots = self.batch.num_slots
        with self.device_watch.call("decode step"):
            raw = self.model.decode_forward(**call.to_contract_kwargs())
            if overlapped:
                return self.overlap.submit(self.model, raw, plan.rows, num_slots)

            def read() -> DecodeResult:
                return DecodeResult(model_output.read_decode(self.model, raw, sampled_on_device=on_device,
                                                             rows=num_slots))

            # Only a device handle has a readback to bound; host tensors are read in place.
            return read() if model_output.is_host_output(raw) else self.device_watch.read("decode readback", read)

    def _verify(self, calls: StepCalls, plan: StepPlan, sampling: DeviceSampling | None,
                drafts: dict[str, list[int]]) -> VerifyResult:
        call = calls.verify(plan, sampling, drafts, self.speculation.settings.num_tokens)
        with self.device_watch.call("decode step"):
            raw = self.model.decode_forward(**call.to_contract_kwargs())
            return VerifyResult.read(self.model, raw, call)

    def _mixed(self, calls: StepCalls, plan: StepPlan) -> MixedResult:
        # Host-sampled: what is in flight is drained first, and the device keeps no token.
        self.overlap.prepare_decode(self.batch, device_sampled=False, penalties=False, logprobs=False)
        self.overlap.reset_batch(plan.rows, device_sampled=False)
        call = calls.mixed(plan)
        with self.device_watch.call("mixed step"):
            raw = cast(TTModelExtras, self.model).mixed_forward(**call.to_contract_kwargs())
            return MixedResult.read(self.model, raw, call)

    def _block(self, calls: StepCalls, plan: StepPlan, limits: dict[str, int]) -> BlockResult:
        self.overlap.reset_batch(plan.rows, device_sampled=False)  # the device keeps no token of a block step
        call = calls.block(plan, limits)
        with self.device_watch.call("decode step"):
            raw = self.model.decode_forward(**call.to_contract_kwargs())
            return BlockResult.read(self.model, raw, call, plan.rows)

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        pending, self._pending = self._pending, None
        if pending is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        plan, result = pending.plan, pending.result
        producing = [r.state for r in plan.rows if r.produces_token]  # before their tokens are appended
        output: ModelRunnerOutput
        match result:
            case InFlightStep():
                return self.overlap.async_output(result, grammar_output)
            case PrefillResult() | DecodeResult() | MixedResult():
                output = self.sampling.sampled(plan, result.output, grammar_output)
            case VerifyResult():
                output = self.speculation.sampled(plan, result.output, result.drafts)
            case BlockResult():
                output = committed_output(plan.rows, result.tokens)
                if self.blocks is not None:
                    self.blocks.committed(result.tokens)
            case _:
                assert_never(result)
        if self._spec is not None:
            self._spec.produced(producing)
        if pending.kv_transfers is not None:
            output.kv_connector_output = pending.kv_transfers
        return output

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The next drafts for vLLM's scheduler (speculative decoding), or None."""
        return self._spec.take_draft_token_ids() if self._spec is not None else None

    def close(self) -> None:
        """Say how the run sampled, close the traces and metrics."""
        self.sampling.close()
        if self.blocks is not None:
            self.blocks.close()
        self.metrics.close()


