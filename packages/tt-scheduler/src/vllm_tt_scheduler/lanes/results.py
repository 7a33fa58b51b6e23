"""Merge what the lanes hand back to the engine: per-client outputs and scheduler stats.

Each lane turns the step's model results into ``EngineCoreOutputs`` for its own requests (its
``update_from_output`` looks results up by request id, so it only touches its own rows). The
engine expects one dict per step, with one stats record covering the whole engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.perf import PerfStats
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from vllm_tt_scheduler.lanes.merge import known_fields


def merge_engine_outputs(
    lanes: Sequence[Mapping[int, EngineCoreOutputs]], stats: SchedulerStats | None
) -> dict[int, EngineCoreOutputs]:
    """Outputs per client index, lanes in order; ``stats`` replaces the lanes' own stats and
    goes to one client only (as vLLM's scheduler does). Reuses the lanes' (fresh) objects."""
    merged: dict[int, EngineCoreOutputs] = {}
    for outputs in lanes:
        for client, lane_out in outputs.items():
            lane_out.scheduler_stats = None
            out = merged.get(client)
            if out is None:
                merged[client] = lane_out
                continue
            out.outputs.extend(lane_out.outputs)
            if lane_out.finished_requests:
                out.finished_requests = (out.finished_requests or set()) | lane_out.finished_requests
    if stats is not None:
        first = next(iter(merged.values()), None)
        if first is None:
            first = merged[0] = EngineCoreOutputs()
        first.scheduler_stats = stats
    return merged


def lane_stats(outputs: Mapping[int, EngineCoreOutputs]) -> SchedulerStats | None:
    """The stats a lane attached to its outputs, if it logs stats."""
    for out in outputs.values():
        if out.scheduler_stats is not None:
            return out.scheduler_stats
    return None


def merge_stats(lanes: Sequence[SchedulerStats | None]) -> SchedulerStats | None:
    """Engine-wide stats: counts summed, KV usage averaged (lanes have equal pools)."""
    present = [stats for stats in lanes if stats is not None]
    if not present:
        return None
    values = {
        "num_running_reqs": sum(s.num_running_reqs for s in present),
        "num_waiting_reqs": sum(s.num_waiting_reqs for s in present),
        "num_skipped_waiting_reqs": sum(s.num_skipped_waiting_reqs for s in present),
        "num_kv_fetch_reqs_by_stage": _sum_counts(getattr(s, "num_kv_fetch_reqs_by_stage", {}) for s in present),
        "kv_cache_usage": sum(s.kv_cache_usage for s in present) / len(present),
        "prefix_cache_stats": _sum_cache_stats([s.prefix_cache_stats for s in present]),
        "kv_cache_eviction_events": [event for s in present for event in s.kv_cache_eviction_events],
        "waiting_lora_adapters": _sum_counts(s.waiting_lora_adapters for s in present),
        "running_lora_adapters": _sum_counts(s.running_lora_adapters for s in present),
    }
    merged = SchedulerStats(**known_fields(SchedulerStats, values))
    # A fact of the one model call, the same in every lane's record.
    merged.cudagraph_stats = next((s.cudagraph_stats for s in present if s.cudagraph_stats is not None), None)
    merged.spec_decoding_stats = sum_spec_stats([s.spec_decoding_stats for s in present
                                                 if s.spec_decoding_stats is not None])
    merged.perf_stats = _sum_perf([s.perf_stats for s in present if s.perf_stats is not None])
    return merged


def sum_spec_stats(stats: Sequence[SpecDecodingStats]) -> SpecDecodingStats | None:
    """Each lane counted the drafts of its own rows (its ``update_from_output`` compares them
    with the tokens they produced); the step verified all of them."""
    if not stats:
        return None
    total = SpecDecodingStats.new(stats[0].num_spec_tokens)
    for s in stats:
        total.num_drafts += s.num_drafts
        total.num_draft_tokens += s.num_draft_tokens
        total.num_accepted_tokens += s.num_accepted_tokens
        for pos, (accepted, drafted) in enumerate(zip(s.num_accepted_tokens_per_pos, s.num_draft_tokens_per_pos,
                                                      strict=True)):
            total.num_accepted_tokens_per_pos[pos] += accepted
            total.num_draft_tokens_per_pos[pos] += drafted
    return total


def _sum_perf(stats: Sequence[PerfStats]) -> PerfStats | None:
    """Each lane counted the work of its own rows; the step did all of it."""
    if not stats:
        return None
    return PerfStats(
        num_flops_per_gpu=sum(s.num_flops_per_gpu for s in stats),
        num_read_bytes_per_gpu=sum(s.num_read_bytes_per_gpu for s in stats),
        num_write_bytes_per_gpu=sum(s.num_write_bytes_per_gpu for s in stats),
    )


def _sum_counts(dicts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in dicts:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return total


def _sum_cache_stats(stats: Sequence[PrefixCacheStats]) -> PrefixCacheStats:
    total = PrefixCacheStats()
    for s in stats:
        total.reset |= s.reset
        total.requests += s.requests
        total.queries += s.queries
        total.hits += s.hits
        total.preempted_requests += s.preempted_requests
        total.preempted_queries += s.preempted_queries
        total.preempted_hits += s.preempted_hits
    return total
