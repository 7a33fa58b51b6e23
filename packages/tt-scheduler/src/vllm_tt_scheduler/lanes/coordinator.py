"""``TTLaneCoordinator``: data-parallel lanes scheduled inside one engine process.

Some models run as one program over a whole Galaxy mesh, submitted once per step, while
holding several independent KV caches (one per sub-mesh, a "lane"). vLLM's multi-process data
parallelism cannot split one submission, and would pay a scatter/gather between processes every
step. So the platform folds ``--data-parallel-size N`` into N lanes of one engine, and this
scheduler runs one phase scheduler per lane (own queues, own KV pool, lane-local block ids),
picks one phase per step for all of them, and merges their outputs into the step the runner
executes.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, NamedTuple

from vllm.logger import init_logger
from vllm.multimodal import MULTIMODAL_REGISTRY, MultiModalRegistry
from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from vllm_tt_scheduler import envs
from vllm_tt_scheduler.carry import carry_over
from vllm_tt_scheduler.lanes.drafts import route_drafts
from vllm_tt_scheduler.lanes.member import TTAsyncLaneScheduler, TTLaneScheduler
from vllm_tt_scheduler.lanes.merge import merge_grammar, merge_outputs
from vllm_tt_scheduler.lanes.results import lane_stats, merge_engine_outputs, merge_stats
from vllm_tt_scheduler.lanes.shape import BlockNumbering, LaneShape
from vllm_tt_scheduler.lanes.trace import open_lane_trace
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import PhasePolicy, WorkView
from vllm_tt_scheduler.scheduler import PhaseScheduling

logger = init_logger("vllm." + __name__)


class _Step(NamedTuple):
    """A merged step in flight, with the lane outputs it was made of (index = lane; None: the
    lane was idle and ran no pass)."""

    merged: SchedulerOutput
    lanes: tuple[SchedulerOutput | None, ...]


def combine_views(views: Iterable[WorkView]) -> WorkView:
    """The whole engine's work: a prefill step stalls every lane's decodes, and runs every
    lane's admissions and chunks."""
    decodes, partials, admissible, full, must_scan, steps, *_ = zip(*views, strict=True)
    return WorkView(sum(decodes), sum(partials), sum(admissible), any(full), any(must_scan), max(steps))


def _empty_output() -> SchedulerOutput:
    """What an idle lane's pass would have produced (for the rare update it still needs)."""
    return SchedulerOutput.make_empty()


def _outcome(plan: Phase, tokens: int) -> Phase:
    """The phase a pass of ``plan`` amounts to (an EMPTY plan runs a prefill pass)."""
    if not tokens:
        return Phase.EMPTY
    return Phase.PREFILL if plan is Phase.EMPTY else plan


def _mixed_outcome(phases: list[Phase], owner: int) -> Phase:
    """What a mixed step over the lanes holds: the owner's chunk beside decode rows (its own or
    another lane's) is MIXED, the chunk alone PREFILL, no chunk DECODE (or EMPTY)."""
    decoded = phases[owner] is Phase.MIXED or any(p is Phase.DECODE for i, p in enumerate(phases) if i != owner)
    if phases[owner] in (Phase.MIXED, Phase.PREFILL):
        return Phase.MIXED if decoded else Phase.PREFILL
    return Phase.DECODE if decoded or phases[owner] is Phase.DECODE else Phase.EMPTY


class TTLaneCoordinator(SchedulerInterface):
    """One phase scheduler per lane; every step is prefill-only, decode-only or empty for all
    (or, for a model running mixed steps, one lane's prompt chunk beside every lane's decodes).

    A new request goes to the lane with the fewest unfinished requests (lowest index on a tie)
    and stays there, preempted or not. The step's phase comes from the same policy as the single
    scheduler's, over all lanes' work; a lane with nothing in that phase and nothing to hand
    over (finished or preempted ids) runs no pass and no update. If a prefill pass admitted
    nothing anywhere while decodes run, every lane redoes the step as decode, carrying what the
    discarded pass drained.
    """

    def __init__(
        self,
        vllm_config: Any,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: MultiModalRegistry = MULTIMODAL_REGISTRY,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.shape = LaneShape.from_vllm_config(vllm_config)
        self.log_stats = log_stats
        lane_cls = TTAsyncLaneScheduler if vllm_config.scheduler_config.async_scheduling else TTLaneScheduler
        lane_config = self.shape.lane_vllm_config(vllm_config)
        self.lanes: tuple[PhaseScheduling, ...] = tuple(
            lane_cls(
                vllm_config=lane_config,
                kv_cache_config=kv_cache_config,
                structured_output_manager=structured_output_manager,
                block_size=block_size,
                hash_block_size=hash_block_size,
                mm_registry=mm_registry,
                include_finished_set=include_finished_set,
                log_stats=log_stats,
            )
            for _ in range(self.shape.lanes)
        )
        self.numbering = BlockNumbering(kv_cache_config.num_blocks)
        options = self.lanes[0].tt_options
        self.phase_policy = PhasePolicy(options.prefill_burst, hold_ratio=options.prefill_hold)
        self._mixed_steps = bool(options.mixed_shapes)
        self.last_phase = Phase.EMPTY
        # Read directly by vLLM's engine core; connectors are refused (requirements.py).
        self.connector = None
        self.ec_connector = None
        self._in_flight: dict[int, _Step] = {}
        self._step_index = 0
        self._trace = open_lane_trace(envs.step_trace_path())
        # Once for the engine: the lanes neither log their (shared) policy nor open a trace.
        logger.info(
            "TT lane coordinator: %d lanes x %d rows (%s lanes), %s, %d KV blocks per lane, block ids "
            "numbered lane * %d + lane-local id, step trace=%s",
            self.shape.lanes, self.shape.rows_per_lane, lane_cls.__name__, self.lanes[0].policy_summary(),
            self.numbering.blocks_per_lane, self.numbering.blocks_per_lane, envs.step_trace_path() or "off",
        )

    # -- one engine step ------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        lanes = self.lanes
        views = [lane.work_view() for lane in lanes]
        view = combine_views(views)
        mixed = self._mixed_owner(views, view.decodes) if self._mixed_steps else None
        if mixed is not None:
            return self._mixed_step(view, views, *mixed, throttle_prefills)
        plan = self.phase_policy.plan(view)
        outputs, scheduled = self._passes(plan, views, throttle_prefills, None)
        retried = False
        if not scheduled:
            fallback = next(filter(None, (lane.fallback_phase(plan) for lane in lanes)), None)
            if fallback is not None:
                if plan is Phase.PREFILL:
                    for lane, lane_view in zip(lanes, views, strict=True):
                        if lane_view.admissible and not (lane_view.partials or lane_view.must_scan):
                            lane.admission_blocked()
                outputs, _ = self._passes(fallback, views, throttle_prefills, outputs)
                plan, retried = fallback, True
        for lane, out in zip(lanes, outputs, strict=True):
            lane.end_step(_outcome(plan, 0 if out is None else out.total_num_scheduled_tokens))
        return self._merged_step(outputs, plan, view, retried)

    def _merged_step(self, outputs: list[SchedulerOutput | None], plan: Phase, view: WorkView,
                     retried: bool) -> SchedulerOutput:
        """The step the runner executes: the lanes' outputs merged, recorded and in flight."""
        merged = merge_outputs(outputs, self.numbering)
        phase = _outcome(plan, merged.total_num_scheduled_tokens)
        # A mixed step stalls no decode: for the policy it is a decode step.
        self.phase_policy.observe(Phase.DECODE if phase is Phase.MIXED else phase, view)
        self.last_phase = phase
        self._in_flight[id(merged)] = _Step(merged, tuple(outputs))
        self._trace.record(self._step_index, phase, merged, outputs, self.lanes, retried)
        self._step_index += 1
        return merged

    def _mixed_owner(self, views: list[WorkView], decodes: int) -> tuple[int, int] | None:
        """For a model running mixed steps: the lane whose prompt this step computes beside
        every lane's decodes, and its chunk (lanes with a partial prefill first, then the lanes
        in turn from this step's index), or None for a phase-pure step."""
        if not any(v.partials or v.admissible for v in views):  # the common decode step: no prompt anywhere
            return None
        count = len(self.lanes)
        order = sorted(range(count), key=lambda i: (not views[i].partials, (i - self._step_index) % count))
        for index in order:
            chunk = self.lanes[index].mixed_chunk(views[index], decodes)
            if chunk is not None:
                return index, chunk
        return None

    def _mixed_step(self, view: WorkView, views: list[WorkView], owner: int, chunk: int,
                    throttle_prefills: bool) -> SchedulerOutput:
        """One mixed step over the lanes: ``owner`` runs a mixed pass (its decodes and one
        prompt's ``chunk``), every other lane a decode pass; the model runs them as one mixed
        program, the chunk in its lane's rows."""
        outputs: list[SchedulerOutput | None] = []
        phases: list[Phase] = []
        for index, lane in enumerate(self.lanes):
            if index == owner:
                out, phase = lane.run_mixed_pass(chunk, throttle_prefills)
            elif lane.idle_in(Phase.DECODE, views[index]):
                out, phase = None, Phase.EMPTY
            else:
                out = lane.run_pass(Phase.DECODE, throttle_prefills)
                phase = _outcome(Phase.DECODE, out.total_num_scheduled_tokens)
            outputs.append(out)
            phases.append(phase)
            lane.end_step(phase)
        return self._merged_step(outputs, _mixed_outcome(phases, owner), view, False)

    def _passes(
        self, plan: Phase, views: list[WorkView], throttle_prefills: bool,
        discarded: list[SchedulerOutput | None] | None,
    ) -> tuple[list[SchedulerOutput | None], int]:
        """Every lane's pass of ``plan``, and the tokens they scheduled; None for a lane that
        would schedule nothing and hand nothing over (vLLM's fixed cost of a pass and an update
        saved). ``discarded``: the outputs this step's earlier passes drained, carried over."""
        outputs: list[SchedulerOutput | None] = []
        tokens = 0
        ran = False
        for index, lane in enumerate(self.lanes):
            before = None if discarded is None else discarded[index]
            if before is None and lane.idle_in(plan, views[index]):
                outputs.append(None)
                continue
            out = lane.run_pass(plan, throttle_prefills, retry=before is not None)
            outputs.append(out if before is None else carry_over(before, out))
            tokens += out.total_num_scheduled_tokens
            ran = True
        if not ran:  # nothing anywhere: still one (empty) pass
            outputs[0] = self.lanes[0].run_pass(plan, throttle_prefills)
        return outputs, tokens

    def _lane_outputs(self, merged: SchedulerOutput) -> tuple[SchedulerOutput | None, ...]:
        step = self._in_flight.get(id(merged))
        if step is None or step.merged is not merged:
            raise RuntimeError(
                "TTLaneCoordinator got a SchedulerOutput it did not schedule, or one already "
                "updated; pass the output of schedule() back exactly once"
            )
        return step.lanes

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        if not scheduler_output.has_structured_output_requests:
            return None
        masks = []
        for lane, out in zip(self.lanes, self._lane_outputs(scheduler_output), strict=True):
            mask = None if out is None else lane.get_grammar_bitmask(out)
            # vLLM hands out a view of a buffer the next lane's call overwrites.
            masks.append(None if mask is None else replace(mask, grammar_bitmask=mask.grammar_bitmask.copy()))
        return merge_grammar(masks)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        """Each lane takes its own rows' results (looked up by request id) from the step's."""
        lane_outputs = self._lane_outputs(scheduler_output)
        del self._in_flight[id(scheduler_output)]
        results: list[dict[int, EngineCoreOutputs]] = []
        stats: list[SchedulerStats | None] = []
        for lane, out in zip(self.lanes, lane_outputs, strict=True):
            if out is None and not lane.finished_req_ids_dict:  # idle: nothing to update or report
                if self.log_stats:
                    stats.append(lane.make_stats())
                continue
            result = lane.update_from_output(out or _empty_output(), model_runner_output)
            results.append(result)
            if self.log_stats:
                stats.append(lane_stats(result))
        return merge_engine_outputs(results, merge_stats(stats) if self.log_stats else None)

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """Each lane takes its own rows' drafts (``route_drafts``)."""
        routed = route_drafts(draft_token_ids, [lane.requests for lane in self.lanes])
        for lane, drafts in zip(self.lanes, routed, strict=True):
            if drafts is not None:
                lane.update_draft_token_ids(drafts)

    def update_draft_token_ids_in_output(
        self, draft_token_ids: DraftTokenIds, scheduler_output: SchedulerOutput
    ) -> None:
        """Async scheduling: each lane's drafts fill its own placeholders in the step in flight."""
        invalid: dict[str, int] = {}
        routed = route_drafts(draft_token_ids, [lane.requests for lane in self.lanes])
        for lane, out, drafts in zip(self.lanes, self._lane_outputs(scheduler_output), routed, strict=True):
            if out is None or drafts is None:
                continue
            lane.update_draft_token_ids_in_output(drafts, out)
            scheduler_output.scheduled_spec_decode_tokens.update(out.scheduled_spec_decode_tokens)
            invalid.update(out.num_invalid_spec_tokens or {})
        scheduler_output.num_invalid_spec_tokens = invalid

    # -- requests ---------------------------------------------------------------------------
    def lane_of(self, request_id: str) -> int | None:
        """The lane holding the request, if any."""
        for index, lane in enumerate(self.lanes):
            if lane.has_request(request_id):
                return index
        return None

    def add_request(self, request: Request) -> None:
        index = self.lane_of(request.request_id)  # a streaming session's next input
        if index is None:
            loads = [sum(lane.get_request_counts()) for lane in self.lanes]
            index = loads.index(min(loads))
        self.lanes[index].add_request(request)

    def has_request(self, request_id: str) -> bool:
        return self.lane_of(request_id) is not None

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        ids: Iterable[str] | None = (
            (request_ids,) if isinstance(request_ids, str) else None if request_ids is None else set(request_ids)
        )
        return [request for lane in self.lanes for request in lane.finish_requests(ids, finished_status)]

    def get_num_unfinished_requests(self) -> int:
        return sum(lane.get_num_unfinished_requests() for lane in self.lanes)

    def has_finished_requests(self) -> bool:
        return any(lane.has_finished_requests() for lane in self.lanes)

    def has_requests(self) -> bool:
        return any(lane.has_requests() for lane in self.lanes)

    def get_request_counts(self) -> tuple[int, int]:
        counts = [lane.get_request_counts() for lane in self.lanes]
        return sum(running for running, _ in counts), sum(waiting for _, waiting in counts)

    # -- read-only views over the lanes (tools and tests; vLLM's engine never reads them) -----
    @property
    def requests(self) -> Mapping[str, Request]:
        return MappingProxyType(ChainMap(*(lane.requests for lane in self.lanes)))

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(request for lane in self.lanes for request in lane.running)

    @property
    def waiting(self) -> tuple[Request, ...]:
        return tuple(request for lane in self.lanes for request in lane.waiting)

    # -- engine-wide state --------------------------------------------------------------------
    @property
    def pause_state(self) -> PauseState:
        return self.lanes[0].pause_state

    def set_pause_state(self, pause_state: PauseState) -> None:
        for lane in self.lanes:
            lane.set_pause_state(pause_state)

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        results = [lane.reset_prefix_cache(reset_running_requests, reset_connector) for lane in self.lanes]
        return all(results)

    def reset_encoder_cache(self) -> None:
        for lane in self.lanes:
            lane.reset_encoder_cache()

    def get_kv_cache_usage(self) -> float:
        return sum(lane.get_kv_cache_usage() for lane in self.lanes) / len(self.lanes)

    def make_stats(self) -> SchedulerStats | None:
        if not self.log_stats:
            return None
        return merge_stats([lane.make_stats() for lane in self.lanes])

    def shutdown(self) -> None:
        for lane in self.lanes:
            lane.shutdown()
        self._trace.close()
