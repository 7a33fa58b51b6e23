"""The vLLM attributes the phase scheduler and the lane coordinator read or write, in one table.

The scheduler wraps vLLM's ``Scheduler`` instead of forking it, so it depends on the names of
vLLM's internals: the queues and limits a pass hides, the request state the admission plan reads,
the KV pool it sizes from, the output fields it carries and merges. Writing a renamed attribute
does not fail; it silently sets a new one that vLLM never reads. ``tests/test_vllm_surface.py``
checks every name here against the installed vLLM's real classes (instances built by the
scheduler simulator where vLLM sets them in ``__init__``), so a release that renames one fails
that test by name. Fields that exist only in some releases of the support window are probed in
``compat`` (with tombstones) and are not listed here; ``lanes.merge.MERGED_FIELDS`` is checked
against ``SchedulerOutput`` by ``test_lanes_merge``.

When the scheduler starts reading or writing another vLLM attribute, add it here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Touch:
    """What the scheduler reads and writes on one vLLM class."""

    owner: str
    """``module:Class`` of the vLLM class."""
    reads: tuple[str, ...]
    """Attributes, methods and fields read (or called, or mutated in place)."""
    writes: tuple[str, ...] = ()
    """Attributes assigned: for a pass (restored after it), or for good."""
    calls: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Methods called with keywords: (method, the keywords passed), checked against its signature."""

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.reads, *self.writes, *(method for method, _ in self.calls))


VLLM_SURFACE: tuple[Touch, ...] = (
    Touch(
        "vllm.v1.core.sched.scheduler:Scheduler",
        reads=(
            # phase scheduler: queues, limits and state a pass and the admission plan read
            "vllm_config", "scheduler_config", "cache_config", "kv_cache_config", "kv_cache_manager",
            "encoder_cache_manager", "waiting", "kv_holding_waiting",
            "requests", "pause_state", "finished_req_ids", "finished_req_ids_dict",
            "reset_preempted_req_ids", "finished_recving_kv_req_ids", "grammar_compile_error_reqs",
            "num_waiting_for_streaming_input", "prev_step_scheduled_req_ids", "use_v2_model_runner",
            "scheduler_reserve_full_isl", "max_model_len",
            # read by vLLM's engine core from any scheduler (the coordinator sets them to None)
            "connector", "ec_connector",
            # methods called on the base class or on each lane
            "schedule", "get_request_counts", "update_from_output", "get_grammar_bitmask",
            "update_draft_token_ids", "update_draft_token_ids_in_output", "add_request",
            "finish_requests", "get_num_unfinished_requests", "has_finished_requests", "has_requests",
            "set_pause_state", "reset_prefix_cache", "reset_encoder_cache", "get_kv_cache_usage",
            "make_stats", "shutdown",
        ),
        writes=("running", "max_num_running_reqs", "max_num_active_reqs", "max_num_scheduled_tokens",
                "current_step", "num_lookahead_tokens"),
    ),
    Touch(
        "vllm.config:VllmConfig",
        reads=("additional_config", "speculative_config", "kv_transfer_config", "ec_transfer_config",
               "kv_events_config"),
        writes=("scheduler_config",),  # on each lane's copy
    ),
    Touch(
        "vllm.config:SchedulerConfig",
        reads=("async_scheduling", "max_num_active_seqs", "enable_chunked_prefill",
               "long_prefill_token_threshold_adaptive"),
        writes=("max_num_seqs", "long_prefill_token_threshold"),  # a lane's copy; a cap from the traces
    ),
    Touch("vllm.config:CacheConfig", reads=("enable_prefix_caching",)),
    Touch("vllm.config:KVEventsConfig", reads=("enable_kv_cache_events",)),
    Touch(
        "vllm.v1.request:Request",
        reads=("request_id", "status", "is_prefill_chunk", "num_tokens",
               "num_prompt_tokens", "structured_output_request", "num_stale_output_tokens",
               "drop_stale_output"),
        writes=("num_computed_tokens",),  # read; and a block-output row's extra KV (block_output)
    ),
    Touch("vllm.v1.outputs:ModelRunnerOutput", reads=("sampled_token_ids", "req_id_to_index")),
    Touch(
        "vllm.v1.request:RequestStatus",
        reads=("RUNNING", "WAITING", "PREEMPTED", "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR",
               "WAITING_FOR_REMOTE_KVS", "WAITING_FOR_STREAMING_REQ"),
    ),
    Touch("vllm.v1.core.sched.interface:PauseState", reads=("UNPAUSED", "PAUSED_NEW")),
    Touch("vllm.v1.structured_output.request:StructuredOutputRequest", reads=("grammar",)),
    Touch("vllm.v1.core.kv_cache_manager:KVCacheManager",
          reads=("block_pool", "watermark_blocks", "coordinator", "empty_kv_cache_blocks")),
    Touch("vllm.v1.core.kv_cache_manager:KVCacheBlocks", reads=("blocks",)),
    # KVFit counts a waiting request's blocks the way allocate_slots does
    Touch(
        "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator",
        reads=(),
        calls=(("get_num_blocks_to_allocate", (
            "request_id", "num_tokens", "new_computed_blocks", "num_encoder_tokens", "total_computed_tokens",
            "num_local_computed_tokens", "num_tokens_main_model", "apply_admission_cap", "prefill_end")),),
    ),
    Touch("vllm.v1.core.block_pool:BlockPool", reads=("get_num_free_blocks", "num_gpu_blocks")),
    Touch("vllm.v1.core.encoder_cache_manager:EncoderCacheManager", reads=("freed",)),
    Touch("vllm.v1.core.encoder_cache_manager:EncoderDecoderCacheManager", reads=("allocated", "to_free")),
    Touch("vllm.v1.kv_cache_interface:KVCacheConfig", reads=("kv_cache_groups", "num_blocks")),
    Touch("vllm.v1.kv_cache_interface:KVCacheGroupSpec", reads=("kv_cache_spec",)),
    Touch("vllm.v1.kv_cache_interface:FullAttentionSpec", reads=("attention_chunk_size",)),
    Touch("vllm.v1.kv_cache_interface:UniformTypeKVCacheSpecs", reads=("kv_cache_specs",)),
    Touch(
        "vllm.v1.core.sched.output:SchedulerOutput",
        reads=("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
               "total_num_scheduled_tokens", "has_structured_output_requests",
               "scheduled_spec_decode_tokens"),
        writes=("finished_req_ids", "preempted_req_ids", "free_encoder_mm_hashes", "new_block_ids_to_zero",
                "kv_cache_block_copies", "num_invalid_spec_tokens"),  # carried over from a discarded pass
    ),
    Touch(
        "vllm.v1.core.sched.output:CachedRequestData",
        reads=("req_ids", "resumed_req_ids", "new_token_ids", "all_token_ids", "new_block_ids",
               "num_computed_tokens", "num_output_tokens"),
    ),
    Touch("vllm.v1.core.sched.output:NewRequestData", reads=("req_id", "block_ids")),
    Touch("vllm.v1.core.sched.output:GrammarOutput",
          reads=("structured_output_request_ids", "grammar_bitmask")),
)
"""Every vLLM class the scheduler reaches into, with the names it uses."""
