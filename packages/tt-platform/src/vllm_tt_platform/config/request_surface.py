"""What the TT backend does with each request field of vLLM's OpenAI completion and chat request
schemas and of ``SamplingParams``, for every supported vLLM release.

A client moving to a TT server keeps sending the fields it sends today; one the backend never
looked at may be silently ignored. ``tests/test_request_surface.py`` reads the installed vLLM's
schemas and fails on a public field this table does not resolve to exactly one class.
"""

from __future__ import annotations

from vllm_tt_platform.config.surface import Entry, Support, class_legend, table_rows

_SAMPLING = "tests/e2e/test_sampling_serve.py::"
_SEEDED = _SAMPLING + "test_seeded_request_is_the_same_alone_batched_fallen_back_and_on_the_host"
_SERVE = "tests/e2e/test_serve.py::"
_KNOBS = "tests/e2e/test_knobs_serve.py::"

W, R, F, N, G = Support.WORKS, Support.REFUSED, Support.FRONT_END, Support.NOT_APPLICABLE, Support.GAP

REQUEST_SURFACE: tuple[Entry, ...] = (
    # --- works, each with the test that serves it -------------------------------------------
    Entry(W, _SERVE + "test_completion", ("model", "prompt", "max_tokens")),
    Entry(W, _SERVE + "test_chat_completion", ("messages",)),
    Entry(W, _SERVE + "test_streaming_equals_non_streaming", ("stream",)),
    Entry(W, _SEEDED, ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                       "frequency_penalty", "ignore_eos", "return_token_ids")),
    Entry(W, "tests/e2e/test_async_overlap.py::test_overlap_stress_matches_overlap_off", ("repetition_penalty",)),
    Entry(W, _SAMPLING + "test_bad_words_are_never_generated", ("bad_words",)),
    Entry(W, _SAMPLING + "test_logit_bias_forces_its_token", ("logit_bias",)),
    Entry(W, _SAMPLING + "test_allowed_token_ids_bound_every_token", ("allowed_token_ids",)),
    Entry(W, _SAMPLING + "test_min_tokens_holds_back_a_stop_token", ("min_tokens", "stop_token_ids")),
    Entry(W, _SAMPLING + "test_json_schema_is_honoured", ("structured_outputs", "request_id")),
    Entry(W, _SAMPLING + "test_logprobs_match_transformers", ("logprobs", "return_tokens_as_token_ids")),
    Entry(W, _SAMPLING + "test_prompt_logprobs_match_transformers_across_chunks", ("prompt_logprobs",)),
    Entry(W, "tests/e2e/test_spec_decode_serve.py::test_stop_strings_end_the_text_exactly", ("stop",)),
    Entry(W, _KNOBS + "test_chat_logprobs_and_max_completion_tokens",
          ("top_logprobs", "max_completion_tokens")),
    Entry(W, _KNOBS + "test_n_choices_are_each_a_seeded_sample", ("n",)),
    Entry(W, _KNOBS + "test_logprob_token_ids_score_the_named_tokens", ("logprob_token_ids",)),
    Entry(W, _KNOBS + "test_high_priority_requests_start_first_on_a_saturated_server", ("priority",)),
    Entry(W, _KNOBS + "test_generation_config_defaults_apply_to_requests_without_them",
          ("response_format",)),
    Entry(W, "tests/e2e/test_reasoning_serve.py::"
          "test_budget_ends_the_think_section_and_the_parser_splits_reasoning_from_content",
          ("thinking_token_budget",)),
    # --- vLLM's front end: templating, tokenizing, detokenizing, output shaping ---------------
    Entry(F, "prompt and chat templating, tokenizing and truncation in vLLM's front end", (
        "add_generation_prompt", "add_special_tokens", "chat_template", "chat_template_kwargs",
        "continue_final_message", "documents", "echo", "suffix", "truncate_prompt_tokens", "truncation_side",
        "media_io_kwargs", "mm_processor_kwargs", "mm_payload", "return_mm_kwargs", "tools", "tool_choice",
        "parallel_tool_calls", "reasoning_effort", "include_reasoning", "user", "session_id")),
    Entry(F, "detokenizing and output shaping in vLLM's front end (output processor)", (
        "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "detokenize",
        "output_kind", "output_text_buffer_length", "flat_logprobs", "stream_options", "stream_interval",
        "return_prompt_text", "return_token_offsets", "return_weight_versions", "skip_clone")),
    Entry(F, "beam search is run by vLLM's front end as many logprob requests", (
        "use_beam_search", "length_penalty")),
    Entry(F, "the prefix-cache key salt is hashed by vLLM's front end into the block hashes", ("cache_salt",)),
    # --- irrelevant to a TT server -------------------------------------------------------------
    Entry(N, "KV / encoder-cache transfer handles of NIXL-style connectors (refused at startup); the served "
             "shared-storage connector keys KV by the prompt's tokens", (
        "kv_transfer_params", "ec_transfer_params")),
    Entry(N, "prompt embeddings; --enable-prompt-embeds is refused at startup", ("prompt_embeds",)),
    # --- accepted but ignored or unverified on TT: the to-do list -----------------------------
    Entry(G, "accepted, no TT test shows its effect", (
        "extra_args", "vllm_xargs", "repetition_detection", "skip_reading_prefix_cache",
        "prompt_logprob_token_ids", "prompt_logprob_start", "trace_decode_token_ids")),
    Entry(G, "follows --watermark-config (a gap)", ("watermarking",)),
    Entry(G, "follows --enable-return-routed-experts (a gap)", ("routed_experts_prompt_start",)),
)
"""Every public request field of vLLM 0.31, 0.32 and 0.33, by class."""


def field(name: str) -> str:
    return name


def markdown_table() -> str:
    """The docs' request-field section: one row per entry, grouped by class."""
    return "\n".join([
        "## vLLM's request fields",
        "",
        "<!-- Generated from vllm_tt_platform.config.request_surface by `python scripts/gen_docs.py`; "
        "do not edit. -->",
        "",
        "What the TT backend does with every field of vLLM's completion and chat request schemas and of "
        "`SamplingParams`, vLLM 0.31 to 0.33 (`tests/test_request_surface.py` fails on a field of the "
        "installed vLLM this table lacks). " + class_legend(),
        "",
        *table_rows(REQUEST_SURFACE, field),
    ]) + "\n"
