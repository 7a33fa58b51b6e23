"""Drive a vLLM scheduler without a model: a fake runner and an engine-core loop.

Used by the tests (step tables, the randomized state machine) and the benchmark. The
runner plays the device side honestly: it keeps its own per-request tokens and KV
length, checks each step against them, classifies the step with ``step_phase`` (so a
mixed step raises), and samples a token that is a pure function of the sequence, so
greedy output can be compared across runs (preempted or not).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.interface import SchedulerInterface
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm_tt_scheduler.phase import MixedStepError, Phase, leaves_prefill_pending, step_phase

VOCAB = 250


@dataclass(frozen=True)
class SimConfig:
    """The engine settings a simulated scheduler is built with."""

    max_num_seqs: int = 4
    max_num_batched_tokens: int = 64
    max_model_len: int = 256
    block_size: int = 16
    num_blocks: int | None = None
    """KV blocks in the pool (one of them is vLLM's null block); default: room for
    ``max_num_seqs`` full-length sequences."""
    async_scheduling: bool = False
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = False
    tt: dict[str, Any] = field(default_factory=dict)
    """The ``tt`` section of ``--additional-config``."""
    num_speculative_tokens: int = 0
    """K of speculative decoding (0: off): the scheduler schedules drafts."""
    spec_proposer: str | None = None
    """A ``custom_class`` proposer path (the model's own drafter); default: n-gram drafts."""

    @property
    def pool_blocks(self) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        return self.max_num_seqs * -(-self.max_model_len // self.block_size) + 1


@cache
def _tiny_model_dir() -> str:
    """A config-only Llama checkpoint: vLLM's ModelConfig needs a config.json."""
    path = tempfile.mkdtemp(prefix="tt-sched-tiny-llama-")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "max_position_embeddings": 8192,
        "torch_dtype": "float32",
    }
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return path


def build_vllm_config(config: SimConfig) -> VllmConfig:
    """A VllmConfig for a tiny model, independent of the active vLLM platform.

    The model config is attached after construction so no platform hook (the TT
    platform's included) rewrites the scheduler settings under test.
    """
    model = ModelConfig(
        model=_tiny_model_dir(),
        skip_tokenizer_init=True,
        max_model_len=config.max_model_len,
        dtype="float32",
    )
    scheduler = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        async_scheduling=config.async_scheduling,
    )
    cache_config = CacheConfig(
        block_size=config.block_size, enable_prefix_caching=config.enable_prefix_caching
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        additional_config={"tt": dict(config.tt)},
    )
    vllm_config.model_config = model
    cache_config.num_gpu_blocks = config.pool_blocks
    if config.num_speculative_tokens:
        k, parallel = config.num_speculative_tokens, vllm_config.parallel_config
        if config.spec_proposer is not None:
            spec = SpeculativeConfig(method="custom_class", model=config.spec_proposer, num_speculative_tokens=k,
                                     target_model_config=model, target_parallel_config=parallel)
        else:
            spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=3, prompt_lookup_min=1,
                                     target_model_config=model, target_parallel_config=parallel)
        vllm_config.speculative_config = spec
    return vllm_config


def build_scheduler(cls: type, config: SimConfig) -> Any:
    """A scheduler of class ``cls`` over a KV pool of ``config.pool_blocks`` blocks."""
    vllm_config = build_vllm_config(config)
    spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=config.pool_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=config.block_size,
    )


def make_request(
    req_id: str,
    prompt_len: int,
    max_tokens: int,
    sampling_params: SamplingParams | None = None,
) -> Request:
    """A request with a deterministic prompt, generating exactly ``max_tokens``."""
    seed = sum(map(ord, req_id))
    prompt = [(seed * 7 + i * 13) % VOCAB + 1 for i in range(prompt_len)]
    params = sampling_params or SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(req_id, prompt, params, None, block_hasher=_block_hasher())


@cache
def _block_hasher() -> Any:
    """Block hashes as the engine core computes them (prefix caching needs them)."""
    init_none_hash(sha256)
    return get_request_block_hasher(SimConfig.block_size, sha256)


def next_token(tokens: list[int]) -> int:
    """The fake model: the next token depends only on the sequence so far."""
    return (sum(tokens[-4:]) * 131 + len(tokens) * 17 + tokens[0]) % VOCAB + 1


def greedy_tokens(req_id: str, prompt_len: int, max_tokens: int) -> list[int]:
    """What the fake model generates for ``make_request(req_id, prompt_len, max_tokens)``,
    never preempted: the reference a scheduled request's tokens must equal."""
    tokens = list(make_request(req_id, prompt_len, max_tokens).prompt_token_ids or [])
    out = []
    for _ in range(max_tokens):
        out.append(next_token(tokens))
        tokens.append(out[-1])
    return out


class RunnerCheckError(AssertionError):
    """The scheduler sent the runner something inconsistent with what it ran before."""


@dataclass
class _RowState:
    tokens: list[int]
    kv_len: int | None
    """Tokens whose KV the runner holds; None after a preemption freed it."""


class FakeRunner:
    """The device side of a step, minus the model.

    ``strict``: a mixed step raises ``MixedStepError`` (a TT runner's behaviour);
    otherwise it is reported as phase None (to drive vLLM's stock scheduler).
    """

    def __init__(self, strict: bool = True, mixed: bool = False) -> None:
        self.strict = strict
        self.mixed = mixed
        """The model runs mixed steps (decode rows and one prompt chunk): ``step_phase`` accepts them."""
        self.rows: dict[str, _RowState] = {}
        self.mid_prefill: set[str] = set()

    def execute(self, out: SchedulerOutput) -> tuple[ModelRunnerOutput, Phase | None]:
        for req_id in out.finished_req_ids:
            self.rows.pop(req_id, None)
            self.mid_prefill.discard(req_id)
        for req_id in out.preempted_req_ids or ():
            if req_id in self.rows:
                self.rows[req_id].kv_len = None
            self.mid_prefill.discard(req_id)
        phase: Phase | None
        try:
            phase = step_phase(out, self.mid_prefill, mixed=self.mixed)
        except MixedStepError:
            if self.strict:
                raise
            phase = None
        for new in out.scheduled_new_reqs:
            if new.req_id in self.rows:
                raise RunnerCheckError(f"{new.req_id} scheduled as new but already on the runner")
            self.rows[new.req_id] = _RowState(list(new.prompt_token_ids or []), new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            row = self.rows.get(req_id)
            if row is None:
                raise RunnerCheckError(f"{req_id} scheduled as cached but unknown to the runner")
            known = cached.all_token_ids.get(req_id)
            if known is not None and list(known) != row.tokens[: len(known)]:
                raise RunnerCheckError(f"{req_id}: scheduler tokens diverge from the runner's")
            if req_id in cached.resumed_req_ids:
                row.kv_len = cached.num_computed_tokens[i]
            elif row.kv_len != cached.num_computed_tokens[i]:
                raise RunnerCheckError(
                    f"{req_id}: scheduler says {cached.num_computed_tokens[i]} computed, "
                    f"runner holds KV for {row.kv_len}"
                )
        req_ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            row = self.rows[req_id]
            start = row.kv_len
            num = out.num_scheduled_tokens[req_id]
            if start is None or start + num > len(row.tokens):
                raise RunnerCheckError(
                    f"{req_id}: chunk [{start}, {start}+{num}) beyond {len(row.tokens)} known tokens"
                )
            row.kv_len = start + num
            if not leaves_prefill_pending(row.kv_len, len(row.tokens)):
                token = next_token(row.tokens)
                row.tokens.append(token)
                sampled.append([token])
                self.mid_prefill.discard(req_id)
            else:
                sampled.append([])
                self.mid_prefill.add(req_id)
        output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        return output, phase


@dataclass
class RequestLog:
    """What happened to one request, in engine steps."""

    arrival_step: int
    token_steps: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    finishes: int = 0
    """How many times a finish (stop, length, error or abort) was reported; must be 1."""


@dataclass(frozen=True)
class StepRecord:
    """One engine step as seen from outside the scheduler."""

    index: int
    phase: Phase | None
    """None: a mixed step (only vLLM's stock scheduler makes those)."""
    num_waiting: int
    num_running: int
    scheduled: dict[str, int]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    """Requests whose finish was reported by the update in this engine step."""
    sent_finished: tuple[str, ...]
    """``finished_req_ids`` handed to the runner with this step."""
    kv_blocks_used: int

    @property
    def phase_code(self) -> str:
        """The phase as a step table writes it: P, D, E, or mixed."""
        return "mixed" if self.phase is None else self.phase.value[0].upper()

    def row(self) -> tuple[str, int, int, dict[str, int], tuple[str, ...], tuple[str, ...]]:
        """The step-table row: phase, waiting, running, scheduled, finished, preempted."""
        return (self.phase_code, self.num_waiting, self.num_running, self.scheduled, self.finished, self.preempted)


def collapse(rows: Iterable[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Rows with runs of identical rows collapsed: ``(repeat, *row)``."""
    table: list[tuple[object, ...]] = []
    for row in rows:
        if table and table[-1][1:] == row:
            table[-1] = (table[-1][0] + 1, *row)  # type: ignore[operator]
        else:
            table.append((1, *row))
    return table


def step_table(records: list[StepRecord]) -> list[tuple[object, ...]]:
    """The records' rows, runs of identical rows collapsed: ``(repeat, *row)``."""
    return collapse(record.row() for record in records)


@dataclass
class HostTime:
    """Seconds spent in the scheduler's two per-step calls."""

    schedule: float = 0.0
    update: float = 0.0
    steps: int = 0


class Engine:
    """The engine core's loop around a scheduler, with a fake runner.

    ``async_depth=1`` mirrors ``EngineCore.step`` (schedule, run, update); ``2``
    mirrors ``step_with_batch_queue`` under async scheduling (the next step is
    scheduled before the previous one's output is processed).
    """

    def __init__(
        self, scheduler: SchedulerInterface, async_depth: int = 1, strict_phases: bool = True
    ) -> None:
        self.scheduler = scheduler
        options = getattr(scheduler, "tt_options", None)
        self.runner = FakeRunner(strict=strict_phases, mixed=bool(options is not None and options.mixed_shapes))
        self.async_depth = async_depth
        self.step_index = 0
        self.logs: dict[str, RequestLog] = {}
        self.unsent_finished: set[str] = set()
        self.host = HostTime()
        self._in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput, int]] = deque()

    def add(self, request: Request) -> None:
        self.logs[request.request_id] = RequestLog(arrival_step=self.step_index)
        self.scheduler.add_request(request)

    def abort(self, req_ids: list[str]) -> None:
        for request in self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED):
            log = self.logs[request.request_id]
            log.finishes += 1
            log.finish_reason = "abort"
            self.unsent_finished.add(request.request_id)

    def has_work(self) -> bool:
        return bool(self._in_flight) or self.scheduler.has_requests()

    def step(self) -> StepRecord | None:
        """One engine step; None when there was nothing to do."""
        record = None
        if self.scheduler.has_requests():
            start = time.perf_counter()
            out = self.scheduler.schedule()
            self.host.schedule += time.perf_counter() - start
            self.host.steps += 1
            runner_out, phase = self.runner.execute(out)
            self.unsent_finished.difference_update(out.finished_req_ids)
            self._in_flight.appendleft((out, runner_out, self.step_index))
            record = self._record(out, phase)
            self.step_index += 1
            if len(self._in_flight) < self.async_depth and (
                out.total_num_scheduled_tokens > 0 or self.scheduler.has_requests()
            ):
                return record
        if not self._in_flight:
            return record
        out, runner_out, index = self._in_flight.pop()
        start = time.perf_counter()
        outputs = self.scheduler.update_from_output(out, runner_out)
        self.host.update += time.perf_counter() - start
        finished = self._absorb(outputs, index)
        if record is None:
            return None
        return StepRecord(**{**record.__dict__, "finished": finished})

    def run(self, max_steps: int) -> list[StepRecord]:
        """Step until idle (or ``max_steps``), returning the records."""
        records = []
        for _ in range(max_steps):
            if not self.has_work():
                break
            record = self.step()
            if record is not None:
                records.append(record)
        return records

    def _record(self, out: SchedulerOutput, phase: Phase | None) -> StepRecord:
        num_running, num_waiting = self.scheduler.get_request_counts()
        kv = getattr(self.scheduler, "kv_cache_manager", None)
        used = 0 if kv is None else kv.block_pool.num_gpu_blocks - 1 - kv.block_pool.get_num_free_blocks()
        return StepRecord(
            index=self.step_index,
            phase=phase,
            num_waiting=num_waiting,
            num_running=num_running,
            scheduled=dict(out.num_scheduled_tokens),
            preempted=tuple(sorted(out.preempted_req_ids or ())),
            finished=(),
            sent_finished=tuple(sorted(out.finished_req_ids)),
            kv_blocks_used=used,
        )

    def _absorb(self, outputs: dict[int, EngineCoreOutputs], step: int) -> tuple[str, ...]:
        finished = []
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                log = self.logs[output.request_id]
                log.tokens.extend(output.new_token_ids)
                log.token_steps.extend([step] * len(output.new_token_ids))
                if output.finish_reason is not None:
                    log.finishes += 1
                    log.finish_reason = str(output.finish_reason)
                    finished.append(output.request_id)
                    self.unsent_finished.add(output.request_id)
        return tuple(sorted(finished))
