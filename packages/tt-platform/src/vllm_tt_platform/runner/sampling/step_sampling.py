"""``StepSampling``: what sampling means for one step, behind the one object the runner calls.

The sampling distribution owns the primitives (the per-batch device/host decision, the device
wire format, vLLM's host sampler over slots); this object owns how a step uses them: where
the batch samples (recorded in the stats and the sampling trace), the host sampler's slots,
prompt logprobs, and the output vLLM reads. What a device-sampling model is sent is part of
the step's call (``runner.call_builder``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm_tt_sampling.decision import (
    NO_DEVICE_LOGPROBS,
    DeviceSamplingCaps,
    DeviceSamplingMode,
    RowSampling,
    SamplingDecision,
    choose_sampling_path,
)
from vllm_tt_sampling.host import HostSamplingBatch, SeedStream
from vllm_tt_sampling.stats import SamplingStats
from vllm_tt_scheduler.phase import Phase

from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.runner.async_decode import SteadySampling
from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.model_output import ModelOutput
from vllm_tt_platform.runner.sampling import output as sampling_output
from vllm_tt_platform.runner.sampling.trace import open_sampling_trace
from vllm_tt_platform.runner.step import ScheduledRow, StepPlan

logger = init_logger("vllm." + __name__)


class StepSampling:
    def __init__(self, vllm_config: VllmConfig, setup: TTSetup) -> None:
        model_config = vllm_config.model_config
        config, caps = setup.config, setup.capabilities
        self.vllm_config = vllm_config
        self.caps = DeviceSamplingCaps(
            max_top_k=caps.max_device_top_k,
            penalties=caps.supports_device_penalties,
            # The device returns raw logprobs only; other logprobs modes are served by the host.
            max_logprobs=caps.max_device_logprobs
            if model_config.logprobs_mode == "raw_logprobs" else NO_DEVICE_LOGPROBS,
        )
        self.mode = DeviceSamplingMode(config.sample_on_device_mode) if config.sample_on_device_mode else None
        self.always_compat = config.always_compat_sampling
        self.logits_processors = bool(model_config.logits_processors)
        self.vocab_size = model_config.get_vocab_size()
        self.stats = SamplingStats()
        self.trace = open_sampling_trace()
        self.prompt_logprobs = sampling_output.PromptLogprobs(self.vocab_size, model_config.logprobs_mode)
        self._step = 0
        self._summarised = False
        self._host: HostSamplingBatch | None = None

    @property
    def steady(self) -> SteadySampling:
        """The facts that decide whether a decode step may stay overlapped."""
        return SteadySampling(self.mode, self.caps, self.always_compat, self.logits_processors)

    def open_host_sampler(self, num_slots: int) -> None:
        """vLLM's sampler over the batch's slots (the runner calls this once the model is
        loaded). Counter stream: a seeded request draws the same tokens on either path."""
        self._host = HostSamplingBatch(num_slots, self.vocab_size, self.vllm_config, seed_stream=SeedStream.COUNTER)

    @property
    def host_sampler(self) -> HostSamplingBatch:
        if self._host is None:
            raise RuntimeError("TTModelRunner.load_model() has not run: there is no host sampler yet")
        return self._host

    # -- the step, in order -------------------------------------------------------------------
    def track(self, out: SchedulerOutput, added: Iterable[RequestState], resumed: Iterable[RequestState],
              released: Iterable[RequestState]) -> None:
        """Follow the batch's changes: host sampler slots, prompt logprobs to collect."""
        sampler = self.host_sampler
        added = list(added)
        for state in released:
            sampler.remove_request(state.slot)
        for state in (*added, *resumed):
            sampler.add_request(state.slot, state.req_id, state.sampling_params,
                                state.prompt_token_ids, state.output_token_ids, state.generator)
        for req_id in out.finished_req_ids:
            self.prompt_logprobs.drop(req_id)
        for state in added:
            self.prompt_logprobs.add(state.req_id, state.sampling_params, state.prompt_token_ids)

    def row_sampling(self, plan: StepPlan) -> list[RowSampling]:
        """What each row of the step asks of the sampler, in plan order."""
        return [
            RowSampling.from_vllm(
                r.state.sampling_params,
                structured_output=r.state.sampling_params.structured_outputs is not None,
                intermediate_chunk=not r.produces_token,
                logits_processors_configured=self.logits_processors,
                num_output_tokens=len(r.state.output_token_ids),
            )
            for r in plan.rows
        ]

    def decide(self, plan: StepPlan, verify: bool = False) -> SamplingDecision:
        """Where this batch samples, and why; recorded in the stats and the sampling trace.
        ``verify``: a verify step of speculative decoding whose drafts the batch can use
        (verified on the device only when every row is greedy)."""
        rows = self.row_sampling(plan)
        decision = choose_sampling_path(rows, mode=self.mode, prefill=plan.phase is Phase.PREFILL, caps=self.caps,
                                        always_compat=self.always_compat, verify=verify,
                                        mixed=plan.phase is Phase.MIXED)
        self.stats.record(decision)
        self._step += 1
        phase = plan.phase.value
        self.trace.record(self._step, phase, decision, [r.state.req_id for r in plan.rows])
        logger.debug("sampling step %d (%s, %d rows): %s (%s)", self._step, phase, len(plan.rows),
                     decision.path.value, decision.reason)
        return decision

    def prompt_logprobs_wanted(self, plan: StepPlan) -> bool:
        """Whether a row of this prefill is collecting prompt logprobs (``PromptLogprobs``)."""
        return self.prompt_logprobs.wanted(plan.rows)

    def collect_prompt_logprobs(self, plan: StepPlan, raw: Any) -> None:
        """Score the prompt chunk of rows collecting prompt logprobs, from a prefill's
        ``return_all_logits`` output."""
        self.prompt_logprobs.collect(plan.rows, raw[0] if isinstance(raw, tuple) else raw)

    def sampled(self, plan: StepPlan, output: ModelOutput, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        """The step's tokens (the device's, or vLLM's sampler over the logits), appended to
        their requests, as the ``ModelRunnerOutput`` vLLM's scheduler reads."""
        producing = [r for r in plan.rows if r.produces_token]
        waiting = [r for r in plan.rows if not r.produces_token]
        result = sampling_output.SampledRows([], None)
        if producing:
            index = _output_rows(plan, producing)
            if output.tokens is not None:
                result = sampling_output.from_device(output, index, producing)
            else:  # model_output.parse() returns tokens or logits
                logits = cast(torch.Tensor, output.logits)
                result = sampling_output.from_host(self.host_sampler, logits[index], producing, grammar_output)
        for r, token in zip(producing, result.tokens, strict=True):
            r.state.output_token_ids.append(token)
        ordered = producing + waiting  # logprobs rows are the producing rows, in this order
        return ModelRunnerOutput(
            req_ids=[r.state.req_id for r in ordered],
            req_id_to_index={r.state.req_id: i for i, r in enumerate(ordered)},
            sampled_token_ids=[[t] for t in result.tokens] + [[] for _ in waiting],
            logprobs=result.logprobs,
            prompt_logprobs_dict=dict(self.prompt_logprobs.take_done()),
        )

    def close(self) -> None:
        """Say once how the run sampled (a silent host fallback costs a logits read-back per
        step), and close the sampling trace."""
        if self.stats.total and not self._summarised:
            logger.info("TT sampling decisions (batches): %s", self.stats.summary())
            self._summarised = True
        self.trace.close()


def _output_rows(plan: StepPlan, producing: Sequence[ScheduledRow]) -> torch.Tensor:
    """Model output rows of ``producing``: slots for decode, plan order for prefill; a mixed
    step's decode rows by slot, its chunk the last row (``MixedResult``)."""
    if plan.phase is Phase.DECODE:
        return torch.tensor([r.state.slot for r in producing], dtype=torch.long)
    if plan.phase is Phase.MIXED:
        return torch.tensor([-1 if r is plan.chunk else r.state.slot for r in producing], dtype=torch.long)
    position = {id(r): i for i, r in enumerate(plan.rows)}
    return torch.tensor([position[id(r)] for r in producing], dtype=torch.long)
