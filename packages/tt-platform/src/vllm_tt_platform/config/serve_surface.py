"""What the TT backend does with each ``vllm serve`` option, for every supported vLLM release.

vLLM adds options every release; one the TT backend never looked at may be silently ignored
while the user believes it is on. This table gives each option destination (argparse ``dest``)
exactly one :class:`Support` class, with its proof (a test, a check) or its reason, and
``tests/test_serve_surface.py`` fails on any destination of the installed vLLM it does not
resolve. Exact entries win over prefix rules; a destination matching two prefix rules is an error.
"""

from __future__ import annotations

import argparse

from vllm_tt_platform.config.surface import Entry, Support, class_legend, table_rows, unresolved

_FEATURES = "vllm_tt_platform.config.startup_checks:check_vllm_features"
_MODALITIES = "vllm_tt_platform.config.startup_checks:restrict_modalities"
_SERVE = "tests/e2e/test_serve.py::test_completion"
_LANES = "tests/e2e/test_lanes_serve.py::test_concurrent_requests_complete_with_their_single_request_output"
_MULTI_HOST = ("tests/e2e/test_multi_host.py::"
               "test_dense_ranks_on_two_hosts_equal_hf_and_the_head_stops_when_the_other_host_dies")
_KNOBS = "tests/e2e/test_knobs_serve.py::"
_UNIMPLEMENTED = "vllm_tt_platform.config.unimplemented:refuse_unimplemented"
_VL = "tests/e2e/test_vl_serve.py::test_serve_chat_with_base64_images_equals_transformers_and_refuses_bad_input"

W, R, F, N, G = Support.WORKS, Support.REFUSED, Support.FRONT_END, Support.NOT_APPLICABLE, Support.GAP

SURFACE: tuple[Entry, ...] = (
    # --- works, each with the test that serves it -------------------------------------------
    Entry(W, _SERVE, ("model", "max_model_len", "max_num_seqs", "served_model_name", "host", "port")),
    Entry(W, "tests/e2e/test_gemma3_serve.py::test_serve_24_concurrent_clients_match_transformers",
          ("block_size",)),
    Entry(W, "tests/e2e/test_qwen3_5_serve.py::test_serve_concurrent_clients_match_transformers",
          ("max_num_batched_tokens",)),
    Entry(W, _LANES, ("data_parallel_size", "api_server_count")),
    Entry(W, _MULTI_HOST, ("headless", "data_parallel_address", "data_parallel_rpc_port",
                           "data_parallel_size_local", "data_parallel_start_rank")),
    Entry(W, "tests/e2e/test_shutdown.py::test_shutdown_timeout_drains_in_flight_requests_to_the_end",
          ("shutdown_timeout",)),
    Entry(W, "tests/e2e/test_spec_decode_serve.py::test_streaming_equals_plain_equals_transformers",
          ("speculative_config",)),
    Entry(W, "tests/e2e/test_spec_decode_lanes_serve.py::test_concurrent_greedy_in_lanes_equals_transformers",
          ("num_gpu_blocks_override",)),
    Entry(W, _VL, ("limit_mm_per_prompt", "enable_prompt_tokens_details")),
    Entry(W, "tests/e2e/test_gemma3_vl_serve.py::test_serve_chat_with_base64_images_equals_transformers",
          ("mm_processor_kwargs",)),
    Entry(W, "tests/e2e/test_sampling_serve.py::test_json_schema_is_honoured", ("structured_outputs_config",)),
    Entry(W, "tests/e2e/test_gemma3_vl_serve.py::test_prefix_cache_reuses_only_the_same_images",
          ("enable_prefix_caching",)),
    Entry(W, "tests/e2e/test_async_overlap.py::test_overlap_stress_matches_overlap_off", ("async_scheduling",)),
    Entry(W, "tests/e2e/test_pooling_serve.py::test_each_input_alone_equals_transformers", ("runner",)),
    Entry(W, "tests/e2e/test_pooling_offline.py::test_mean_is_not_cls", ("pooler_config",)),
    Entry(W, "tests/e2e/test_decoder_embedding_serve.py::test_each_input_alone_equals_transformers", ("convert",)),
    Entry(W, "tests/e2e/test_decoder_rerank_serve.py::test_score_equals_transformers", ("hf_overrides",)),
    Entry(W, "packages/tt-platform/tests/test_metrics.py::test_only_the_serve_front_end_turns_metrics_on",
          ("disable_log_stats",)),
    Entry(W, ("tests/e2e/test_sampling_serve.py::"
           "test_seeded_request_is_the_same_alone_batched_fallen_back_and_on_the_host"),
          ("additional_config",)),
    Entry(W, "tests/test_cli_flags.py::test_config_file_entry_is_recorded", ("config",)),
    Entry(W, _KNOBS + "test_both_served_names_answer_and_equal_transformers", ("seed", "tokenizer_mode")),
    Entry(W, _KNOBS + "test_enforce_eager_is_said_at_startup_and_runs_without_traces", ("enforce_eager",)),
    Entry(W, _KNOBS + "test_chunked_prefill_off_prefills_a_long_prompt_in_one_step", ("enable_chunked_prefill",)),
    Entry(W, _KNOBS + "test_generation_config_defaults_apply_to_requests_without_them",
          ("generation_config", "override_generation_config")),
    Entry(W, _KNOBS + "test_max_logprobs_bounds_requests_by_name", ("max_logprobs",)),
    Entry(W, _KNOBS + "test_high_priority_requests_start_first_on_a_saturated_server", ("scheduling_policy",)),
    Entry(W, "tests/e2e/test_kv_offload.py::test_evicted_prefixes_come_back_from_host_memory",
          ("kv_offloading_size", "kv_offloading_backend")),
    # ExampleConnector (P/D over shared storage); every connector but it and OffloadingConnector
    # is refused by startup_checks.check_kv_transfer
    Entry(W, "tests/e2e/test_disagg_serve.py::test_prefill_on_one_engine_decode_on_the_other", ("kv_transfer_config",)),
    # a recurrent state per KV block (vLLM's align mode); another --mamba-block-size is refused
    Entry(W, "packages/tt-host/tests/test_host_qwen3_5.py::test_prefix_caching_config_keeps_a_state_per_kv_block",
          ("mamba_block_size", "mamba_cache_mode")),
    # the parser splits reasoning from content; its reasoning config is what thinking_token_budget forces
    Entry(W, "tests/e2e/test_reasoning_serve.py::"
          "test_budget_ends_the_think_section_and_the_parser_splits_reasoning_from_content",
          ("reasoning_parser", "reasoning_config")),
    # --- refused at startup ------------------------------------------------------------------
    Entry(R, _FEATURES, ("tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend",
                         "data_parallel_backend", "enable_sleep_mode",
                         "enable_prompt_embeds", "enable_lora")),
    Entry(R, _FEATURES, prefix="lora_"),
    Entry(R, _FEATURES, ("max_loras", "max_lora_rank", "max_cpu_loras", "fully_sharded_loras",
                         "default_mm_loras", "specialize_active_lora", "enable_tower_connector_lora",
                         "enable_mixed_moe_lora_format", "enable_moe_shared_loras", "max_lora_cls_labels")),
    Entry(R, _FEATURES, prefix="sleep_"),
    Entry(R, _MODALITIES, ("enable_mm_embeds",)),
    Entry(R, _UNIMPLEMENTED, ("decode_context_parallel_size", "prefill_context_parallel_size",
                              "enable_expert_parallel", "enable_eplb", "enable_dbo", "cpu_offload_gb",
                              "enable_return_routed_experts", "watermark_config")),
    # --- platform-independent front end ------------------------------------------------------
    Entry(F, "vLLM's OpenAI API server: HTTP, TLS, CORS, auth, docs, access logs", (
        "uds", "uvicorn_log_level", "disable_uvicorn_access_log", "disable_access_log_for_endpoints",
        "allow_credentials", "allowed_origins", "allowed_methods", "allowed_headers", "api_key", "root_path",
        "middleware", "enable_request_id_headers", "disable_fastapi_docs", "enable_offline_docs",
        "enable_server_load_tracking", "sse_keep_alive_interval", "enable_tokenizer_info_endpoint",
        "enable_force_include_usage", "enable_per_request_metrics", "log_error_stack", "tokens_only",
        "enable_scale_out", "fingerprint_mode", "fingerprint_value", "grpc", "grpc_port", "help",
        "return_tokens_as_token_ids", "response_role", "max_log_len", "enable_log_outputs",
        "enable_log_deltas", "enable_log_requests", "enable_flash_late_interaction")),
    Entry(F, "vLLM's API server: TLS settings", prefix="ssl_"),
    Entry(F, "vLLM's API server: HTTP parser limits", prefix="h11_"),
    Entry(F, "vLLM's API server: TLS certificate reload", ("enable_ssl_refresh",)),
    Entry(F, "vLLM's data-parallel supervisor process (host-side supervision of the engines)",
          prefix="dp_supervisor_"),
    Entry(F, "vLLM's data-parallel supervisor port", ("data_parallel_supervisor_port",)),
    Entry(F, "chat templating, tool calling and reasoning text parsing run in vLLM's front end", (
        "chat_template", "chat_template_content_format", "trust_request_chat_template",
        "trust_request_mm_kwargs", "default_chat_template_kwargs", "reasoning_effort_map",
        "enable_auto_tool_choice", "exclude_tools_when_tool_choice_none", "tool_call_parser",
        "tool_parser_plugin", "tool_strict_level", "tool_server", "cohere_is_reasoning_model", "cohere_format",
        "anthropic_disabled_thinking_effort", "reasoning_parser_plugin")),
    Entry(F, "checkpoint and tokenizer download and lookup on the host", (
        "tokenizer", "trust_remote_code", "hf_config_path", "revision", "code_revision", "tokenizer_revision",
        "config_format", "hf_token", "download_dir", "ignore_patterns", "use_tqdm_on_load",
        "allowed_local_media_path", "allowed_media_domains", "media_io_kwargs", "renderer_num_workers")),
    Entry(F, "vLLM's multimodal processor cache and hashing on the host", (
        "mm_processor_cache_gb", "mm_processor_cache_type", "mm_hasher_algorithm",
        "mm_shm_cache_max_object_size_mb", "interleave_mm_strings")),
    Entry(F, "vLLM's logging, tracing export and metrics names", (
        "logging_config", "log_level", "log_config_file", "show_hidden_metrics_for_version",
        "otlp_traces_endpoint", "collect_detailed_traces", "custom_histogram_buckets",
        "aggregate_engine_logging", "fail_on_environ_validation", "enable_logging_iteration_details")),
    # --- irrelevant to a TT device -----------------------------------------------------------
    Entry(N, "CUDA graphs: TT captures its own traces (--additional-config.tt.trace_mode)", (
        "cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_metrics")),
    Entry(N, "selects a CUDA/Triton kernel backend; TT models run their own ttnn kernels", (
        "attention_backend", "mamba_backend", "mamba_ssu_algorithm", "moe_backend", "linear_backend",
        "sparse_indexer_topk_backend", "gdn_prefill_backend", "kda_prefill_backend", "kda_decode_backend",
        "mm_encoder_attn_backend", "ir_op_priority", "enable_flashinfer_autotune", "monokernel",
        "disable_cascade_attn", "use_fp64_gumbel", "attention_config", "kernel_config", "compilation_config",
        "optimization_level", "performance_mode", "enable_layerwise_nvtx_tracing", "jit_monitor_mode",
        "jit_monitor_verbose")),
    Entry(N, "CUDA memory allocators and GPU-side IPC buffers", ("enable_cumem_allocator", "mm_ipc_gpu_memory_gb")),
    Entry(N, "NCCL/torch.distributed collectives between GPU workers; a TT model spreads over the mesh", (
        "enable_nccl_comm_suspend", "disable_custom_all_reduce", "disable_nccl_for_dp_synchronization",
        "master_addr", "master_port", "nnodes", "node_rank", "distributed_timeout_seconds",
        "cpu_distributed_timeout_seconds", "all2all_backend", "dcp_comm_backend")),
    Entry(N, "Ray worker options; the Ray backend is refused (check_vllm_features)", ("ray_workers_use_nsight",)),
    Entry(N, "GPU device and NUMA placement; TT devices are chosen by MESH_DEVICE", (
        "device_ids", "numa_bind", "numa_bind_nodes", "numa_bind_cpus")),
    # --- accepted but ignored, overridden or unverified on TT: the to-do list ----------------
    Entry(G, "overwritten: the TT platform installs its own scheduler / worker classes", (
        "scheduler_cls", "worker_cls")),
    Entry(G, "not read: the runner sizes the KV cache on the mesh (its budget, or --num-gpu-blocks-override)", (
        "gpu_memory_utilization", "kv_cache_memory_bytes")),
    Entry(G, "accepted, no TT test shows its effect", (
        "dtype", "quantization", "quantization_config", "allow_deprecated_quantization",
        "logprobs_mode", "skip_tokenizer_init",
        "model_class_overrides", "model_impl", "logits_processors",
        "io_processor_plugin", "load_format", "model_loader_extra_config", "pt_load_map_location",
        "disable_sliding_window", "return_sampling_mask", "enable_trace_replay",
        "max_num_scheduled_tokens", "max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens",
        "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive", "disable_chunked_mm_input",
        "scheduler_reserve_full_isl", "watermark", "prefill_schedule_interval",
        "disable_hybrid_kv_cache_manager", "stream_interval", "kv_cache_dtype", "kv_cache_dtype_skip_layers",
        "prefix_caching_hash_algo", "prefix_cache_retention_interval", "prefix_match_unit",
        "kv_sharing_fast_prefill", "swa_bounded_replay", "language_model_only", "skip_mm_profiling",
        "spec_method", "spec_model", "spec_tokens", "kv_events_config", "ec_transfer_config",
        "ec_manager_config", "engram_config", "aux_output_config", "profiler_config",
        "watchdog_config", "weight_transfer_config", "diffusion_config", "per_request_spec_decode_metrics",
        "kv_cache_metrics", "kv_cache_metrics_sample", "enable_mfu_metrics", "safetensors_load_strategy",
        "safetensors_prefetch_num_threads", "safetensors_prefetch_block_size", "max_parallel_loading_workers",
        "worker_extension_cls", "enable_fault_tolerance", "fault_tolerance_config", "video_pruning_rate",
        "video_pruning_method", "mm_tensor_ipc", "mm_processor_device", "mm_device_do_normalize",
        "mm_encoder_only", "mm_encoder_tp_mode", "mm_encoder_attn_dtype", "enable_hc_sp",
        "enable_shm_tensor_arena")),
    Entry(G, "mm encoder fp8 scales: accepted, not read by TT vision encoders", prefix="mm_encoder_fp8_"),
    Entry(G, "recurrent-state cache options: accepted, no TT test shows their effect", (
        "mamba_cache_dtype", "mamba_ssm_cache_dtype", "enable_mamba_shared_prefix_checkpoint",
        "enable_mamba_cache_stochastic_rounding", "mamba_cache_philox_rounds", "replayssm_buffer_len", "use_replayssm")),
    Entry(G, "weight offloading to host memory: accepted, not implemented for the mesh's weights", (
        "offload_backend", "cpu_offload_params",
        "offload_group_size", "offload_num_in_group", "offload_prefetch_step", "offload_params")),
    Entry(G, "parallelism variants beyond -dp: not checked by the TT platform", (
        "dcp_q_replicate", "dcp_kv_cache_interleave_size",
        "cp_kv_cache_interleave_size", "data_parallel_rank",
        "data_parallel_hybrid_lb", "data_parallel_external_lb", "data_parallel_multi_port_external_lb",
        "enable_batch_sharded_sampling", "enable_ep_weight_filter",
        "ubatch_size", "enable_elastic_ep", "elastic_ep_max_dp_size", "dbo_decode_token_threshold",
        "dp_sync_interval", "dbo_prefill_token_threshold", "eplb_config",
        "expert_placement_strategy")),
)
"""Every ``vllm serve`` destination of vLLM 0.31, 0.32 and 0.33, by class."""


def destinations(parser: argparse.ArgumentParser) -> list[str]:
    """The destinations of ``parser``'s options (positional arguments are not options)."""
    return sorted({action.dest for action in parser._actions if action.option_strings})


def problems(parser: argparse.ArgumentParser, surface: tuple[Entry, ...] = SURFACE) -> list[str]:
    """One line per option destination of ``parser`` the table does not resolve to exactly one class."""
    return unresolved(destinations(parser), surface)


def flag(dest: str) -> str:
    """The option a destination comes from (vLLM names every one ``--`` + the dest, dashed)."""
    return "--" + dest.replace("_", "-")


def markdown_table() -> str:
    """The docs' ``vllm serve`` surface section: one row per entry, grouped by class."""
    return "\n".join([
        "## vLLM's `vllm serve` options",
        "",
        "<!-- Generated from vllm_tt_platform.config.serve_surface by `python scripts/gen_docs.py`; "
        "do not edit. -->",
        "",
        "What the TT backend does with every `vllm serve` option of vLLM 0.31 to 0.33 "
        "(`tests/test_serve_surface.py` fails on an option of the installed vLLM this table lacks). "
        + class_legend(),
        "",
        *table_rows(SURFACE, flag),
    ]) + "\n"
