"""Speculative decoding in the runner: drafts in, verify step, drafts out.

vLLM owns the machinery: its scheduler hands each running row's drafts in
``scheduled_spec_decode_tokens`` (``-1``: a placeholder for a row that has none yet), its
rejection sampler decides which drafts stand, its scheduler rolls back the rest and counts
acceptance, and after each step its engine asks the worker for the next drafts
(``take_draft_token_ids``), made here by the method's ``drafters.Drafter``: vLLM's
``NgramProposer`` over each row's tokens, or a drafter checkpoint on the mesh
(``draft_model``).

A step whose rows carry drafts is a *verify step*: a decode step of the fixed shape
``[decode rows, 1 + K]`` (one trace per K). With device sampling on and every row greedy the
device verifies it: it returns its argmax after each position (token ids only), and the host
keeps each row's matching drafts (``vllm_tt_sampling.acceptance``); otherwise the logits of
every position are read back and vLLM's rejection sampler decides (the per-batch decision,
``vllm_tt_sampling.decision``, says which). When a row of the batch asks for something the
verify path does not carry (logprobs, penalties, a grammar:
``vllm_tt_sampling.decision.drafts_blocked_by``), the runner runs that step as a plain decode
step without drafts: each row takes its one token, and vLLM counts the drafts as rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm_tt_sampling.acceptance import accept_greedy
from vllm_tt_sampling.decision import RowSampling, drafts_blocked_by
from vllm_tt_sampling.host import HostSamplingBatch
from vllm_tt_sampling.host.speculative import DraftVerifier
from vllm_tt_scheduler.phase import Phase

from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.drafters import Drafter
from vllm_tt_platform.runner.step import ScheduledRow, StepPlan
from vllm_tt_platform.runner.step_results import committed_output

PLACEHOLDER = -1
"""vLLM's draft id for "no draft here" (new or resumed rows, grammar-invalid drafts)."""

@dataclass(frozen=True)
class SpecSettings:
    """What ``--speculative-config`` asked for, as the runner uses it."""

    method: str
    num_tokens: int
    """K: drafts per row and step; a verify step carries ``1 + K`` tokens per row."""

    @classmethod
    def of(cls, vllm_config: VllmConfig) -> SpecSettings | None:
        spec = vllm_config.speculative_config
        if spec is None:
            return None
        return cls(str(spec.method), int(spec.num_speculative_tokens))

    def describe(self, lanes: int, rows_per_lane: int, device_sampling: bool, drafter: str = "") -> str:
        """For the startup summary: the method, K, the verify trace shape (per lane: each
        lane's sub-mesh verifies its own rows in the one step over all lanes), where verify
        steps are verified and, for a drafter model, where it runs and what its KV costs."""
        shape = f"[{rows_per_lane} rows, {1 + self.num_tokens}]"
        if lanes > 1:
            shape += f" per lane x {lanes} lanes"
        where = ("on device when every row is greedy (argmax ids read back), else on the host"
                 if device_sampling else "on the host")
        text = f"{self.method}, K={self.num_tokens}, verify trace {shape}, verified {where}"
        return f"{text}; {drafter}" if drafter else text


def row_sampling(state: RequestState) -> RowSampling:
    params = state.sampling_params
    return RowSampling.from_vllm(params, structured_output=params.structured_outputs is not None,
                                 intermediate_chunk=False, num_output_tokens=len(state.output_token_ids))


def real_drafts(out: SchedulerOutput) -> dict[str, list[int]]:
    """Each scheduled row's drafts up to its first placeholder; rows without any are left out."""
    drafts = {}
    for req_id, ids in out.scheduled_spec_decode_tokens.items():
        kept = []
        for token in ids:
            if token == PLACEHOLDER:
                break
            kept.append(int(token))
        if kept:
            drafts[req_id] = kept
    return drafts


class Speculation:
    """The runner's speculative decoding: which drafts a step verifies, their acceptance, and
    the drafter's drafts handed to vLLM after each step."""

    def __init__(self, vllm_config: VllmConfig, settings: SpecSettings, drafter: Drafter,
                 host_sampler: HostSamplingBatch) -> None:
        self.settings = settings
        self.drafter = drafter
        self.verifier = DraftVerifier(host_sampler, vllm_config.model_config.logprobs_mode)
        self._produced: list[RequestState] = []

    def warmup_kwargs(self) -> dict[str, Any]:
        """``warmup_model_decode`` also captures the verify trace of ``1 + K`` tokens."""
        return {"verify_tokens": 1 + self.settings.num_tokens}

    def step_drafts(self, out: SchedulerOutput, plan: StepPlan) -> dict[str, list[int]]:
        """The drafts this step verifies: a decode step's real drafts, none when a row blocks
        them (a plain decode step then: the plan's rows are one token each; see the module
        docstring)."""
        if plan.phase is not Phase.DECODE:
            return {}
        drafts = real_drafts(out)
        if drafts and drafts_blocked_by([row_sampling(r.state) for r in plan.rows]) is not None:
            return {}
        return drafts

    def accept(self, output: torch.Tensor, rows: list[ScheduledRow], drafts: dict[str, list[int]]) -> list[list[int]]:
        """Each row's tokens from a verify step's output: the device's argmax tokens
        ``[num_slots, 1 + K]`` (greedy rows), or logits ``[num_slots, 1 + K, V]`` for vLLM's
        rejection sampler."""
        slots = [r.state.slot for r in rows]
        row_drafts = [drafts.get(r.state.req_id, []) for r in rows]
        if not output.is_floating_point():
            return accept_greedy(output[slots].tolist(), row_drafts)
        return self.verifier.verify(output[slots], slots, row_drafts)

    def sampled(self, plan: StepPlan, output: torch.Tensor, drafts: dict[str, list[int]]) -> ModelRunnerOutput:
        """The verify step's tokens per row (variable length: accepted drafts + one), appended
        to the rows, as vLLM's scheduler reads them (no grammar: a row with one blocks drafts)."""
        tokens = self.accept(output, plan.rows, drafts)
        for r, row_tokens in zip(plan.rows, tokens, strict=True):
            drafted = len(drafts.get(r.state.req_id, ()))
            self.drafter.verified(r.state.req_id, drafted, min(len(row_tokens) - 1, drafted))
        return committed_output(plan.rows, tokens)

    def produced(self, states: list[RequestState]) -> None:
        """The rows that gained tokens in the step just sampled (they get drafts next)."""
        self._produced = states

    def released(self, states: list[RequestState]) -> None:
        """Rows that left the batch (finished or preempted): the drafter forgets them."""
        self.drafter.forget(s.req_id for s in states)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafter's drafts for the rows that produced a token last step; rows whose
        sampling the verify path does not carry get no drafts (they decode one token a step)."""
        states = [s for s in self._produced if drafts_blocked_by([row_sampling(s)]) is None]
        self._produced = []
        if not states:
            return None
        return DraftTokenIds([s.req_id for s in states], self.drafter.propose(states))
