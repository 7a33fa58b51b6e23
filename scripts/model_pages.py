"""The model-families and feature-support pages, rendered from the model registry.

Families come from the builtin tt-metal table and from every installed model source (the host
backend's ``HOST_MODELS``); capabilities from each class's ``model_capabilities`` plus what its
registration declares. Only two things are written by hand here: a title per capability
(``FEATURES``) and which tests prove a capability for which host family (``PROOFS``).
Nothing reads the environment, so the pages are the same wherever they are generated.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from vllm_tt_models_registry.builtin import BUILTIN_FAMILIES, BuiltinFamily
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.names import tt_arch_name
from vllm_tt_models_registry.registry import BUILTIN, TTNN_BACKEND, RegisteredModel, load_registry
from vllm_tt_models_registry.sources import installed_source_names

GENERATED = "<!-- Generated from the model registry by `python scripts/gen_docs.py`; do not edit. -->"


@dataclass(frozen=True)
class Feature:
    """How the pages name one ``ModelCapabilities`` field, and where it is explained."""

    title: str
    page: str


FEATURES: dict[str, Feature] = {
    "supports_sample_on_device": Feature("Device sampling", "sampling.md"),
    "supports_async_decode": Feature("Overlapped decode", "async-decode.md"),
    "supports_prefix_caching": Feature("Prefix caching", "troubleshooting.md#behaviour-changes-that-are-logged-not-errors"),
    "single_program_lanes": Feature("In-process lanes", "lanes.md"),
    "max_device_top_k": Feature("Device top-k (largest k)", "sampling.md#which-batches-sample-on-the-device"),
    "supports_device_penalties": Feature("Device penalties", "sampling.md#which-batches-sample-on-the-device"),
    "max_device_logprobs": Feature("Device logprobs (top n)", "sampling.md#logprobs"),
    "supports_prompt_logprobs": Feature("Prompt logprobs", "sampling.md#prompt-logprobs"),
    "supports_kv_transfer": Feature("KV offload to host memory, disaggregated prefill/decode", "kv-offload.md"),
    "supports_verify_decode": Feature("Speculative decoding (verify steps)", "speculative-decoding.md"),
    "max_verify_tokens": Feature("Longest verify step (1 + K)", "speculative-decoding.md#limits"),
    "supports_mtp": Feature("MTP speculation (the checkpoint's MTP module)",
                            "speculative-decoding.md#the-models-mtp-module-mtp"),
    "supports_eagle3": Feature("EAGLE-3 speculation (a head reading the target's auxiliary hidden states)",
                               "speculative-decoding.md#eagle-3-heads-eagle3"),
    "max_model_drafts": Feature("The model's own drafter (custom_class, most drafts)",
                                "speculative-decoding.md#the-models-own-drafter-custom_class"),
    "max_block_tokens": Feature("Block output (the model's own drafter, longest block)",
                                "speculative-decoding.md#block-output-the-models-own-drafter-inside-the-decode-step"),
    "prefill_trace_lens": Feature("Prefill trace lengths", "scheduling.md#chunked-prefill-for-every-model"),
    "mixed_shapes": Feature("Mixed steps (decode rows + a prompt chunk)", "scheduling.md#mixed-steps"),
    "pooling_model": Feature("Pooling model (embeddings)", "pooling.md"),
    "pooled_outputs": Feature("Pooling head (classifier, reranker)", "pooling.md#rerankers-score-and-rerank"),
    "supports_pooling": Feature("Embeddings from a decoder (--runner pooling)",
                                "pooling.md#decoder-embedding-and-reranking-models"),
    "kv_cache_kinds": Feature("KV cache kinds", "bundles.md#hybrid-kv-sliding-window-and-mixed-attention-layers"),
    "modalities": Feature("Multimodal inputs", "vision.md#video"),
    "chunked_mm_input": Feature("Multimodal items split over prefill chunks", "vision.md#what-a-model-declares"),
}

ROOT = Path(__file__).resolve().parent.parent
ARCH_PARAM = "arch"
"""A proof's ``archs`` when the test is parametrized over ``arch``: pytest's own collection
then says which tiny checkpoints it runs, so a family added to the parametrization is marked
without an edit here."""


@dataclass(frozen=True)
class Proof:
    """A test that shows ``feature`` working on the host models of the tiny ``archs``."""

    feature: str
    test: str
    """``path/to/test_file.py::test_name``, relative to the repository root."""
    archs: tuple[str, ...] | str
    """``vllm-tt-tiny-model --arch`` values the test builds its checkpoint with, or
    :data:`ARCH_PARAM` for a test parametrized over them."""
    shows: str

    @property
    def path(self) -> str:
        return self.test.split("::")[0]

    @property
    def function(self) -> str:
        return self.test.split("::")[1]


_E2E = "tests/e2e"
_HOST_TESTS = "packages/tt-host/tests"
PROOFS: tuple[Proof, ...] = (
    Proof("supports_pooling", f"{_E2E}/test_decoder_embedding_serve.py::test_each_input_alone_equals_transformers",
          ("qwen3",), "vllm serve --runner pooling --convert embed: last-token vectors equal transformers'"),
    Proof("supports_sample_on_device",
          f"{_E2E}/test_sampling_serve.py::test_greedy_on_device_equals_host_sampled_greedy_and_transformers",
          ("llama",), "greedy tokens sampled on the device equal host-sampled greedy and transformers"),
    Proof("supports_sample_on_device",
          f"{_HOST_TESTS}/test_host_models.py::test_device_sampling_greedy_returns_argmax_tokens",
          ("qwen3",), "prefill and decode with sampling parameters return the argmax token ids"),
    Proof("supports_sample_on_device",
          f"{_E2E}/test_gemma3_serve.py::test_greedy_matches_transformers_with_device_sampling_and_overlap",
          ("gemma3",), "greedy sampled on the device equals transformers, page tables per layer included"),
    Proof("supports_async_decode",
          f"{_E2E}/test_gemma3_serve.py::test_greedy_matches_transformers_with_device_sampling_and_overlap",
          ("gemma3",), "overlap stays on (a step submitted before the last is read back), outputs unchanged"),
    Proof("supports_async_decode", f"{_E2E}/test_async_overlap.py::test_real_math_overlap_matches_overlap_off",
          ("llama",), "the engine with overlapped decode generates what it generates without"),
    Proof("supports_async_decode",
          f"{_HOST_TESTS}/test_async_host_model.py::test_device_is_authoritative_for_continuing_slots",
          ("llama",), "the device keeps each slot's token and position between decodes"),
    Proof("supports_prefix_caching", f"{_HOST_TESTS}/test_host_models.py::test_greedy_parity_with_transformers",
          ARCH_PARAM, "a prefix-cache hit (prefill from start_pos 32) matches transformers"),
    Proof("supports_prefix_caching", f"{_E2E}/test_gemma3_serve.py::test_greedy_matches_transformers_past_the_window",
          ("gemma3",), "prefix-cache hits 200 tokens deep, past the sliding window, match transformers"),
    Proof("supports_prefix_caching", f"{_E2E}/test_gemma4_serve.py::test_greedy_matches_transformers",
          ("gemma4",), "prefix-cache hits past the window match transformers, KV-shared layers reading them"),
    Proof("supports_prefix_caching", f"{_HOST_TESTS}/test_host_gpt_oss.py::test_prefix_cache_hit_reads_only_its_window",
          ("gpt_oss",), "a hit on 4 cached blocks: the sliding layer reads only the blocks its window reaches"),
    Proof("supports_prefix_caching", f"{_HOST_TESTS}/test_host_qwen3_5.py::"
          "test_states_at_block_boundaries_equal_recompute_and_a_prefix_hit_continues_from_them",
          ("qwen3_5",), "recurrent states left at block boundaries equal a recompute; a hit continues from them"),
    Proof("supports_prefix_caching", f"{_E2E}/test_qwen3_5_prefix_cache.py::"
          "test_a_repeated_long_prompt_and_a_later_turn_start_from_the_cached_state",
          ("qwen3_5",), "vLLM's align mode: a repeated prompt and a later turn start from the cached delta-net "
          "state and equal transformers"),
    Proof("supports_kv_transfer", f"{_HOST_TESTS}/test_kv_transfer.py::test_blocks_go_to_the_host_and_back_into_other_blocks",
          ("llama", "gemma3", "deepseek_v3", "qwen3_5"), "full, sliding, latent and recurrent-state blocks copied to the "
          "host and back into other blocks hold the same values"),
    Proof("supports_kv_transfer", f"{_E2E}/test_kv_offload.py::test_evicted_prefixes_come_back_from_host_memory",
          ("llama",), "--kv-offloading-size: prefixes evicted from a 12-block device pool load back from host memory; "
          "outputs equal transformers"),
    Proof("supports_kv_transfer", f"{_E2E}/test_disagg_serve.py::test_prefill_on_one_engine_decode_on_the_other",
          ("llama",), "prefill on one vllm serve, decode on another (ExampleConnector, a router in front): outputs "
          "equal transformers, the decode engine computed only each prompt's tail"),
    Proof("supports_kv_transfer", f"{_E2E}/test_disagg_kv_kinds.py::test_kv_kind_round_trips_between_engines",
          ("gemma3", "deepseek_v3"), "sliding-window, full and latent-attention blocks stored by one engine and "
          "loaded by another: outputs equal transformers"),
    Proof("supports_kv_transfer", f"{_E2E}/test_qwen3_5_prefix_cache.py::"
          "test_evicted_prefixes_come_back_from_host_memory_with_their_states",
          ("qwen3_5",), "--kv-offloading-size on Qwen 3.5: evicted prefixes load back with their delta-net states; "
          "outputs equal transformers"),
    Proof("single_program_lanes",
          f"{_E2E}/test_lanes_serve.py::test_concurrent_requests_complete_with_their_single_request_output",
          ("llama",), "4 lanes on an emulated Galaxy serve 64 requests, each with its single-request output"),
    Proof("single_program_lanes", f"{_HOST_TESTS}/test_host_models.py::test_lanes_keep_separate_kv_caches",
          ("qwen3",), "two lanes keep separate KV caches and match transformers"),
    Proof("single_program_lanes", f"{_HOST_TESTS}/test_host_gpt_oss.py::test_lanes_on_a_galaxy_mesh_keep_separate_kv",
          ("gpt_oss",), "4 lanes on an emulated Galaxy each see only their own KV and match transformers"),
    Proof("single_program_lanes", f"{_E2E}/test_gpt_oss_serve.py::test_galaxy_lanes_serve_greedy_matches_transformers",
          ("gpt_oss",), "vllm serve as 4 lanes on an emulated Galaxy generates what transformers does"),
    Proof("single_program_lanes",
          f"{_E2E}/test_deepseek_v3_serve.py::test_galaxy_lanes_serve_greedy_matches_transformers",
          ("deepseek_v3",), "vllm serve as 4 lanes on an emulated Galaxy, each with its own latent cache, "
          "generates what transformers does"),
    Proof("max_device_top_k",
          f"{_E2E}/test_sampling_serve.py::test_seeded_request_is_the_same_alone_batched_fallen_back_and_on_the_host",
          ("llama",), "top-k 5 and 10 sample on the device"),
    Proof("max_device_top_k", f"{_E2E}/test_async_overlap.py::test_drain_rules_in_the_engine",
          ("llama",), "a top-k of 100 is sampled on the host"),
    Proof("supports_device_penalties",
          f"{_E2E}/test_sampling_serve.py::test_seeded_request_is_the_same_alone_batched_fallen_back_and_on_the_host",
          ("llama",), "a batch with presence and frequency penalties samples on the device"),
    Proof("max_device_logprobs", f"{_E2E}/test_sampling_serve.py::test_logprobs_match_transformers",
          ("llama",), "logprobs=0 on the device and logprobs=5 on the host match transformers"),
    Proof("supports_prompt_logprobs",
          f"{_HOST_TESTS}/test_sampling_host_models.py::test_all_logits_match_transformers_over_chunks",
          ("qwen3",), "every position's logits match transformers, chunk by chunk"),
    Proof("supports_prompt_logprobs",
          f"{_E2E}/test_sampling_serve.py::test_prompt_logprobs_match_transformers_across_chunks",
          ("llama",), "prompt logprobs through the OpenAI API match transformers across chunks"),
    Proof("supports_prompt_logprobs", f"{_HOST_TESTS}/test_host_gpt_oss.py::test_prefill_logits_at_every_position",
          ("gpt_oss",), "every position's logits over three sliding windows match transformers"),
    Proof("supports_prompt_logprobs", f"{_HOST_TESTS}/test_host_deepseek_v3.py::test_prefill_logits_at_every_position",
          ("deepseek_v3",), "every position's logits through the latent cache match transformers"),
    Proof("supports_prompt_logprobs",
          f"{_HOST_TESTS}/test_host_gemma3.py::test_prefill_logits_match_transformers_at_every_position",
          ("gemma3",), "every position's logits over seven sliding windows match transformers"),
    Proof("supports_prompt_logprobs",
          f"{_HOST_TESTS}/test_host_gemma4.py::test_prefill_logits_match_transformers_at_every_position",
          ("gemma4", "gemma4_e", "gemma4_moe"),
          "every position's logits over seven windows match transformers, with per-layer inputs and with experts"),
    Proof("supports_mtp", f"{_HOST_TESTS}/test_host_mtp.py::test_drafts_match_the_module_in_transformers",
          ("deepseek_v3",), "the MTP module's first and chained drafts equal the same module in transformers"),
    Proof("supports_mtp", f"{_E2E}/test_mtp.py::test_greedy_equals_transformers_alone_and_24_concurrent",
          ("deepseek_v3",), "MTP drafts, verified: 24 concurrent greedy requests equal transformers; drafts accepted"),
    Proof("supports_mtp", f"{_E2E}/test_mtp.py::test_max_tokens_stop_tokens_and_eos_are_exact",
          ("deepseek_v3",), "max_tokens, stop tokens and EOS are exact with MTP drafts"),
    Proof("supports_eagle3",
          f"{_HOST_TESTS}/test_host_eagle3.py::test_chained_drafts_match_the_head_over_transformers_hidden_states",
          ("llama",), "the EAGLE-3 head's chained drafts equal the head in plain torch over transformers' hidden states"),
    Proof("supports_eagle3", f"{_E2E}/test_eagle3.py::test_greedy_equals_transformers_alone_and_24_concurrent",
          ("llama",), "EAGLE-3 drafts, verified: 24 concurrent greedy requests equal transformers; drafts accepted"),
    Proof("supports_eagle3", f"{_E2E}/test_eagle3_serve.py::test_streaming_equals_plain_equals_transformers_in_lanes",
          ("llama",), "vllm serve in 4 lanes with an EAGLE-3 head: streaming = plain = transformers, drafts accepted"),
    Proof("supports_mtp", f"{_HOST_TESTS}/test_host_qwen3_5.py::test_mtp_drafts_match_the_module_in_transformers",
          ("qwen3_5",), "the mtp.* module's first and chained drafts equal the same module in transformers"),
    Proof("supports_mtp", f"{_E2E}/test_mtp.py::test_greedy_equals_transformers_alone_and_24_concurrent",
          ("qwen3_5",), "mtp.* drafts on the recurrent hybrid, verified: 24 concurrent greedy requests (rows "
          "preempted) equal transformers; drafts accepted and rejected"),
    Proof("supports_mtp", f"{_E2E}/test_mtp.py::test_max_tokens_stop_tokens_and_eos_are_exact",
          ("qwen3_5",), "max_tokens, stop tokens and EOS are exact with mtp.* drafts"),
    Proof("supports_verify_decode",
          f"{_HOST_TESTS}/test_host_qwen3_5.py::test_verify_logits_and_the_state_after_a_partial_accept_equal_transformers",
          ("qwen3_5",), "verify logits at every position equal transformers for kept and rejected drafts; the "
          "delta-net state after a partial accept equals a plain prefill's (one state slot per position)"),
    Proof("supports_verify_decode",
          f"{_E2E}/test_qwen3_5_ngram.py::test_greedy_equals_transformers_with_24_requests_chunks_and_preemption",
          ("qwen3_5",), "n-gram speculation on the recurrent hybrid: 24 greedy requests in chunks and under "
          "preemption equal transformers"),
    Proof("supports_verify_decode", f"{_HOST_TESTS}/test_host_verify.py::test_verify_logits_equal_consecutive_decode_steps",
          ("llama", "gemma3"), "a [rows, 1 + K] verify step gives, at every position, the logits and KV of plain decode steps"),
    Proof("supports_verify_decode", f"{_E2E}/test_spec_decode.py::test_greedy_equals_transformers_alone_and_concurrent",
          ("llama",), "n-gram speculation through vllm.LLM generates what transformers does; drafts are accepted"),
    Proof("supports_verify_decode", f"{_E2E}/test_spec_decode.py::test_preemption_with_drafts_in_flight_stays_exact",
          ("llama",), "rows preempted under KV pressure with drafts in flight still generate what transformers does"),
    Proof("supports_verify_decode", f"{_E2E}/test_spec_decode.py::test_seeded_sampling_takes_drafts_and_keeps_its_tokens",
          ("llama",), "seeded sampled rows take drafts and keep the tokens they draw without speculation"),
    Proof("supports_verify_decode",
          f"{_E2E}/test_spec_decode.py::test_sampled_continuations_keep_the_target_distribution",
          ("llama",), "sampled continuations under speculation pass chi-square against transformers' exact distribution"),
    Proof("supports_verify_decode",
          f"{_E2E}/test_spec_decode_lanes_serve.py::test_concurrent_greedy_in_lanes_equals_transformers",
          ("llama",), "n-gram speculation in 4 lanes (TG) through vllm serve: concurrent greedy clients equal transformers"),
    Proof("supports_verify_decode",
          f"{_E2E}/test_spec_decode_lanes_serve.py::test_preemption_in_lanes_with_drafts_in_flight_stays_exact",
          ("llama",), "rows preempted in several lanes with drafts in flight still generate what transformers does"),
    Proof("supports_verify_decode", f"{_E2E}/test_spec_decode_serve.py::test_streaming_equals_plain_equals_transformers",
          ("llama",), "greedy verify steps verified on the device (argmax ids only) equal transformers, streamed or not"),
    Proof("supports_verify_decode", f"{_E2E}/test_draft_model.py::test_greedy_equals_transformers_alone_and_24_concurrent",
          ("llama",), "a 1-layer drafter model's drafts, verified: 24 concurrent greedy requests equal transformers"),
    Proof("supports_verify_decode",
          f"{_E2E}/test_draft_model.py::test_sampled_continuations_keep_the_target_distribution",
          ("llama",), "sampled continuations with drafter-model drafts pass chi-square against transformers"),
    Proof("supports_verify_decode",
          f"{_E2E}/test_draft_model_serve.py::test_streaming_equals_plain_equals_transformers_in_lanes",
          ("llama",), "a drafter model in 4 lanes (TG) through vllm serve: streamed = plain = transformers"),
    Proof("max_verify_tokens", "tests/test_validation.py::test_bad_speculation_is_refused_at_startup",
          ("llama",), "num_speculative_tokens beyond the longest verify trace is refused at startup, naming it"),
    Proof("max_block_tokens",
          f"{_HOST_TESTS}/test_host_block_output.py::test_blocks_equal_consecutive_greedy_decode_steps_and_their_kv",
          ("llama",), "a block step commits exactly the greedy tokens and KV of consecutive plain decode steps"),
    Proof("max_model_drafts",
          f"{_HOST_TESTS}/test_host_block_output.py::"
          "test_model_drafts_are_the_half_depth_models_greedy_tokens_and_leave_the_target_exact",
          ("llama",), "the model's drafts equal transformers' half-depth model, greedy; the target is unchanged"),
    Proof("max_model_drafts",
          f"{_E2E}/test_model_drafts.py::test_greedy_outputs_equal_transformers_with_the_models_own_drafts_accepted",
          ("llama",), "vllm serve with custom_class: greedy = transformers alone, 4 at once and streamed, drafts accepted"),
    Proof("mixed_shapes",
          f"{_HOST_TESTS}/test_host_mixed.py::test_mixed_steps_equal_a_decode_step_and_a_prefill_step_with_the_same_kv",
          ("llama", "gemma3"), "a mixed step's decode logits and chunk logits and KV equal a decode step and a prefill step"),
    Proof("prefill_trace_lens", f"{_HOST_TESTS}/test_host_models.py::test_traces_must_be_captured_by_warmup",
          ("mistral",), "warmup captures one prefill trace per declared length that fits the model length"),
)


def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a dataclass's fields (not kept at run time, so parsed)."""
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for field_node, doc_node in zip(body.body, body.body[1:], strict=False):
        if (isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name)
                and isinstance(doc_node, ast.Expr) and isinstance(doc_node.value, ast.Constant)):
            docs[field_node.target.id] = " ".join(str(doc_node.value.value).split())
    return docs


def _features() -> dict[str, Feature]:
    missing = [f.name for f in fields(ModelCapabilities) if f.name not in FEATURES]
    if missing:
        raise SystemExit(f"capabilities {missing} have no entry in FEATURES (scripts/model_pages.py): add one")
    return {f.name: FEATURES[f.name] for f in fields(ModelCapabilities)}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ", ".join(map(str, value)) if value else "none"
    return str(value)


def _declared(capabilities: Mapping[str, Any]) -> str:
    return ", ".join(f"`{k}={_value(v)}`" for k, v in capabilities.items()) or "—"


def _class_summary(model_cls: type) -> str:
    doc = inspect.getdoc(model_cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _source_models(name: str) -> list[tuple[RegisteredModel, type]]:
    """The entries model source ``name`` registers, with their (imported, checked) classes."""
    registry = load_registry(name, environ={})
    return [(m, m.load_class()) for m in registry.entries() if m.source == name]


def _builtin_archs(fam: BuiltinFamily) -> str:
    return "<br>".join(f"`{tt_arch_name(a)}`" for a in fam.archs)


def _tiny_archs() -> dict[str, str]:
    """``--arch`` of each tiny checkpoint -> the TT architecture it is served as."""
    from vllm_tt_host.tiny import ARCHITECTURES

    return {key: tt_arch_name(hf) for key, hf in ARCHITECTURES.items()}


@cache
def collected_archs(test: str) -> tuple[str, ...]:
    """The ``arch`` values pytest collects ``test`` with (collection only: nothing runs)."""
    import pytest

    seen: list[str] = []

    class Recorder:
        def pytest_collection_modifyitems(self, items: list[Any]) -> None:
            seen.extend(item.callspec.params[ARCH_PARAM] for item in items if hasattr(item, "callspec"))

    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = pytest.main([str(ROOT / test), "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[Recorder()])
    if code != 0 or not seen:
        raise SystemExit(f"collecting {test} over {ARCH_PARAM!r} failed (pytest exit {code}):\n{out.getvalue()}")
    return tuple(sorted(set(seen)))


def proof_archs(proof: Proof) -> tuple[str, ...]:
    return collected_archs(proof.test) if proof.archs == ARCH_PARAM else tuple(proof.archs)


def proofs_for(arch: str) -> list[Proof]:
    """The proofs that cover host architecture ``arch`` (a TT name)."""
    tiny = _tiny_archs()
    return [p for p in PROOFS if any(tiny.get(k) == arch for k in proof_archs(p))]


def models_page() -> str:
    lines = [
        "# Model families",
        "",
        GENERATED,
        "",
        "A checkpoint is served by the class registered for its architecture (`architectures` in its "
        "`config.json`), prefixed with `TT`. Precedence, highest first: bundles from `EXTRA_MODELS_DIR` "
        "([bundles.md](bundles.md)), then the mesh backend's own models, then the builtin tt-metal table. "
        "`vllm-tt-models list --backend host` prints the registry of an installed environment. What each "
        "family can do is in [features.md](features.md).",
        "",
        f"## Tenstorrent hardware (`mesh_backend={TTNN_BACKEND}`): the builtin tt-metal table",
        "",
        "The classes live in tt-metal's `models` package and are imported only when served; they "
        "declare their own `model_capabilities`. The table may add capabilities on top.",
        "",
        "| family | TT architectures | implementation (`module:Class` in tt-metal) | selected by | the table declares |",
        "|---|---|---|---|---|",
    ]
    for fam in BUILTIN_FAMILIES:
        for name, variant in fam.variants.items():
            if fam.selector is None:
                chosen = "—"
            else:
                default = " (default)" if name == fam.selector.default else ""
                chosen = f"`{fam.selector.name}={name}`{default}"
            lines.append(f"| {fam.name} | {_builtin_archs(fam)} | `{variant.target}` | {chosen} | "
                         f"{_declared(variant.capabilities)} |")
    for source in installed_source_names():
        models = _source_models(source)
        lines += [
            "",
            f"## Mesh backend `{source}`: its own models",
            "",
            f"With `TT_MESH_BACKEND={source}` (or `--additional-config.tt.mesh_backend {source}`) these "
            f"classes serve their architectures in place of the builtin table's:",
            "",
            "| TT architecture | class | what it is | capabilities (besides the defaults) |",
            "|---|---|---|---|",
        ]
        for model, model_cls in models:
            caps = ModelCapabilities.of(model_cls, dict(model.overrides)).non_defaults()
            lines.append(f"| `{model.arch}` | `{model.target}` | {_class_summary(model_cls)} | "
                         f"{_declared(caps)} |")
        rest = [m.arch for m in load_registry(source, environ={}).entries() if m.source == BUILTIN]
        lines += ["", (
            f"The builtin table's other architectures stay registered on `{source}` and resolve to "
            f"tt-metal's classes: {', '.join(f'`{a}`' for a in rest)}." if rest else
            f"Every architecture of the builtin table is served by `{source}`'s own classes."
        )]
    return "\n".join(lines) + "\n"


def features_page() -> str:
    features = _features()
    docs = _field_docs(ModelCapabilities)
    defaults = ModelCapabilities()
    lines = [
        "# Feature support",
        "",
        GENERATED,
        "",
        "What each model family provides, per mesh backend, read from the capability declarations "
        "(`model_capabilities` of the class, plus what its registration declares; see "
        "[bundles.md](bundles.md#capabilities)). Nothing is keyed on a model or class name. Without a "
        "capability: a batch the device sampler cannot express samples on the host for that step; a "
        "`prompt_logprobs` request is refused (HTTP 400); `--data-parallel-size` is vLLM's multi-process "
        "data parallelism; an explicit `sample_on_device_mode`, `--async-scheduling` or "
        "`--enable-prefix-caching` is refused at startup ([troubleshooting.md](troubleshooting.md)).",
        "",
        "## Features",
        "",
        "| feature | capability | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, feature in features.items():
        lines.append(f"| [{feature.title}]({feature.page}) | `{name}` | {_value(getattr(defaults, name))} | "
                     f"{docs.get(name, '')} |")
    header = "| family | " + " | ".join(f.title for f in features.values()) + " |"
    rule = "|---" * (len(features) + 1) + "|"
    lines += [
        "",
        f"## Tenstorrent hardware (`mesh_backend={TTNN_BACKEND}`)",
        "",
        "·: declared by the tt-metal class itself and read at startup (`vllm-tt-models list` shows it "
        "where tt-metal is installed); other cells are what the builtin table declares for the variant.",
        "",
        header,
        rule,
    ]
    for fam in BUILTIN_FAMILIES:
        for name, variant in fam.variants.items():
            label = fam.name if len(fam.variants) == 1 else f"{fam.name} (`{name}`)"
            cells = [_value(variant.capabilities[f]) if f in variant.capabilities else "·" for f in features]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for source in installed_source_names():
        lines += _source_matrix(source, features, header, rule)
    return "\n".join(lines) + "\n"


def _source_matrix(source: str, features: dict[str, Feature], header: str, rule: str) -> list[str]:
    refs: dict[str, int] = {}
    rows: list[str] = []
    for model, model_cls in _source_models(source):
        caps = ModelCapabilities.of(model_cls, dict(model.overrides))
        proofs = proofs_for(model.arch)
        cells = []
        for f in features:
            marks = [refs.setdefault(p.test, len(refs) + 1) for p in proofs if p.feature == f]
            tests = f" (T{', T'.join(map(str, marks))})" if marks else ""
            cells.append(_value(getattr(caps, f)) + tests)
        rows.append(f"| `{model.arch}` | " + " | ".join(cells) + " |")
    lines = [
        "",
        f"## Mesh backend `{source}`",
        "",
        "T*n*: a test that shows the feature working on that family (listed below); the host models "
        "are built from tiny checkpoints the tests make (`vllm-tt-tiny-model`).",
        "",
        header,
        rule,
        *rows,
    ]
    if refs:
        lines += ["", "| | test | shows |", "|---|---|---|"]
        for test, number in refs.items():
            proofs = [p for p in PROOFS if p.test == test]
            shown = "; ".join(dict.fromkeys(p.shows for p in proofs))
            lines.append(f"| T{number} | `{proofs[0].path}` `{proofs[0].function}` | {shown} |")
    return lines
