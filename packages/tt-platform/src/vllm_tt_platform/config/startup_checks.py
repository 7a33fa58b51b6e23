"""Checks of a vLLM config against what the TT backend can serve, run before any device work.

Each check raises a typed error naming the setting, the bad value and the fix. Where the user
did not ask for something (it is only vLLM's default), the feature is switched off with one
info line instead.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from vllm_tt_models_registry.contract import ModelCapabilities

from vllm_tt_platform.config.eagle3 import Eagle3HeadConfig
from vllm_tt_platform.config.kv_transfer import (
    CONNECTOR_MODULES,
    NOT_ROUND_TRIPPED_KINDS,
    OFFLOADING,
    SHARED_STORAGE,
    SPEC_KEYS,
    resolved_kv_transfer,
    select_connector_module,
    select_spec,
)
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.envs import VLLM_TARGET_DEVICE, VLLM_USE_V2_MODEL_RUNNER
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, SpeculativeConfig, VllmConfig

TT_DEVICE_NAMES = ("", "tt")


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    target = VLLM_TARGET_DEVICE.read(environ)
    if target.lower() not in TT_DEVICE_NAMES:
        raise TTConfigError(
            "VLLM_TARGET_DEVICE", target, "unset (or 'tt') while the TT backend serves",
            "unset VLLM_TARGET_DEVICE: it selects another vLLM platform",
        )
    v2 = VLLM_USE_V2_MODEL_RUNNER.read(environ)
    if v2.lower() not in ("0", "false"):
        raise TTUnsupportedFeatureError(
            "VLLM_USE_V2_MODEL_RUNNER", v2,
            "unset or 0; the TT model runner implements the V1 runner interface",
            "unset VLLM_USE_V2_MODEL_RUNNER",
        )


def check_vllm_features(vllm_config: VllmConfig) -> None:
    """Reject vLLM features the TT backend does not provide."""
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size > 1:
        raise TTUnsupportedFeatureError(
            "--tensor-parallel-size", parallel.tensor_parallel_size, "1",
            "remove -tp; a TT model spreads over the mesh chosen with MESH_DEVICE (e.g. MESH_DEVICE=T3K)",
        )
    if parallel.pipeline_parallel_size > 1:
        raise TTUnsupportedFeatureError(
            "--pipeline-parallel-size", parallel.pipeline_parallel_size, "1",
            "remove -pp; a TT model spreads over the mesh chosen with MESH_DEVICE (e.g. MESH_DEVICE=T3K)",
        )
    ray = [flag for flag, value in (("--data-parallel-backend", parallel.data_parallel_backend),
                                    ("--distributed-executor-backend", parallel.distributed_executor_backend))
           if value == "ray"]
    if ray:
        raise TTUnsupportedFeatureError(
            ray[0], "ray", "mp (vLLM's own processes)",
            f"remove {ray[0]} ray: Ray places workers by its resources and the TT platform declares "
            "none for Tenstorrent devices (each host's mesh is opened by that host's engine); for "
            "several hosts use vLLM's multi-node data parallelism (--data-parallel-address, "
            "--headless; docs/multi-host.md)",
        )
    spec = vllm_config.speculative_config
    if spec is not None and spec.method not in SPECULATIVE_METHODS:
        raise TTUnsupportedFeatureError(
            "--speculative-config method", spec.method, ", ".join(SPECULATIVE_METHODS),
            'use --speculative-config \'{"method": "ngram", "num_speculative_tokens": 3}\' or '
            '\'{"method": "draft_model", "model": <drafter>, "num_speculative_tokens": 3}\' '
            "(docs/speculative-decoding.md)",
        )
    if vllm_config.lora_config is not None:
        raise TTUnsupportedFeatureError(
            "--enable-lora", True, "off", "remove --enable-lora; LoRA adapters are not supported on TT",
        )
    model = vllm_config.model_config
    if model is None:
        return
    if model.enable_sleep_mode:
        raise TTUnsupportedFeatureError(
            "--enable-sleep-mode", True, "off",
            "remove --enable-sleep-mode; the weights and KV cache live on the mesh in the model's own "
            "buffers, which cannot be released and restored (restart the server to free the mesh)",
        )
    if getattr(model, "enable_prompt_embeds", False):
        raise TTUnsupportedFeatureError(
            "--enable-prompt-embeds", True, "off", "remove --enable-prompt-embeds; prompt embeddings are not supported on TT",
        )
    cache = vllm_config.cache_config
    if cache.user_specified_block_size and cache.block_size % 32:
        raise TTConfigError("--block-size", cache.block_size, "a multiple of 32 (the device tile)",
                            "use --block-size 32 or 64")


def apply_enforce_eager(vllm_config: VllmConfig, tt: MutableMapping[str, Any]) -> str | None:
    """``--enforce-eager`` means no captured graphs; on TT that is ``trace_mode none`` (every
    program runs eagerly). Returns the line to log at startup, None without ``--enforce-eager``.
    A ``trace_mode`` asking for traces as well is a contradiction, refused by name."""
    model = vllm_config.model_config
    if model is None or not model.enforce_eager:
        return None
    mode = tt.get("trace_mode", "none")
    if mode != "none":
        raise TTConfigError(
            "--additional-config.tt.trace_mode", mode, "none (or unset) with --enforce-eager",
            "remove --enforce-eager to capture traces, or remove trace_mode",
        )
    tt["trace_mode"] = "none"
    return "--enforce-eager: trace_mode none (no traces are captured; every program runs eagerly)."


def check_encoder_decoder(vllm_config: VllmConfig, caps: ModelCapabilities, arch: str) -> None:
    """vLLM serves an encoder-decoder model (its config says ``is_encoder_decoder``) with a
    cross-attention KV group and the encoder inputs on the first prefill; a TT model takes that
    only when it declares the ``cross_attention`` KV kind (its ``cross_page_table``)."""
    model = vllm_config.model_config
    if model is not None and model.is_encoder_decoder and "cross_attention" not in caps.kv_cache_kinds:
        raise TTUnsupportedFeatureError(
            "--model", model.model, "a decoder-only model, or one whose TT class declares the cross_attention "
            "KV kind", f"{arch} does not read a cross-attention KV cache; serve a decoder-only model",
        )


def check_runner(vllm_config: VllmConfig, caps: ModelCapabilities, arch: str) -> None:
    """``--runner pooling`` needs a TT pooling model (``pooling_model``) or a generation model
    that runs pooling programs (``supports_pooling``: vLLM's ``--convert embed``); a pooling
    model serves nothing else. vLLM's ``--convert`` adapters wrap torch modules, which TT models
    are not: the TT class itself is the embedding model or the classifier."""
    model = vllm_config.model_config
    runner = model.runner_type
    convert = getattr(model, "convert_type", "none")
    served = {"none", "auto"} | ({"embed"} if caps.supports_pooling else set()) | (
        {"classify"} if caps.pooled_outputs else set())
    if convert not in served:  # first: vLLM has already turned --convert into --runner pooling
        raise TTUnsupportedFeatureError(
            "--convert", convert, ", ".join(sorted(served)) + f" for {arch}",
            "remove --convert (--runner pooling serves a decoder as an embedding model); a reranker "
            "from a causal LM is its own architecture: --hf-overrides '{\"architectures\": "
            "[\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": [\"no\", \"yes\"], "
            "\"is_original_qwen3_reranker\": true}' (docs/pooling.md)",
        )
    if runner == "pooling" and not (caps.pooling_model or caps.supports_pooling):
        raise TTUnsupportedFeatureError(
            "--runner", runner, f"generate for {arch}, whose model_capabilities declare neither "
            "pooling_model nor supports_pooling",
            "remove --runner pooling (and --convert), or serve a checkpoint with a TT pooling model "
            "(a BertModel embedding checkpoint, a Qwen3 decoder; docs/pooling.md)",
        )
    if runner != "pooling" and caps.pooling_model:
        raise TTUnsupportedFeatureError(
            "--runner", runner, f"pooling for {arch}, a pooling model (embeddings)",
            "serve it with --runner pooling (vllm serve <model> --runner pooling; vllm.LLM(..., runner='pooling'))",
        )


def check_kv_transfer(vllm_config: VllmConfig, caps: ModelCapabilities, arch: str, lanes: int) -> None:
    """A KV connector is served when it is one of ``SERVED_CONNECTORS`` with its TT worker side,
    for a model that copies KV blocks to the host, on one lane; then that worker side is
    selected. Every other connector copies blocks in vLLM's own tensor layout (or through its
    own transfer engine), while the TT KV cache lives on the mesh in the model's: refused here,
    by name, before any device work."""
    kv = resolved_kv_transfer(vllm_config)
    if kv is None:
        return
    connector = kv.kv_connector
    if connector not in SERVED_CONNECTORS:
        raise TTUnsupportedFeatureError(
            "KV connector (--kv-transfer-config kv_connector / --kv-offloading-backend)", connector,
            f"{OFFLOADING} (--kv-offloading-size <GiB> with the native backend) or {SHARED_STORAGE} "
            "(--kv-transfer-config, disaggregated prefill/decode over shared storage)",
            "serve KV offloading with --kv-offloading-size <GiB> (--kv-offloading-backend native, "
            f"VLLM_USE_SIMPLE_KV_OFFLOAD unset) and disaggregated prefill/decode with {SHARED_STORAGE}; "
            "the other connectors (NIXL, Mooncake, LMCache, ...) read vLLM's GPU tensors, which the TT KV "
            "cache is not (docs/disaggregation.md)",
        )
    module = CONNECTOR_MODULES.get(connector)
    if kv.kv_connector_module_path not in (None, module):
        raise TTUnsupportedFeatureError(
            "--kv-transfer-config kv_connector_module_path", kv.kv_connector_module_path,
            f"unset ({connector} is served by the TT platform's own worker side)",
            "remove kv_connector_module_path: a connector module of your own reads vLLM's GPU tensors",
        )
    setting = "--kv-offloading-size" if connector == OFFLOADING else "--kv-transfer-config"
    if not caps.supports_kv_transfer:
        raise TTUnsupportedFeatureError(
            setting, connector, f"unset for {arch}, whose model_capabilities do not declare "
            "supports_kv_transfer", f"remove {setting}, or serve a model whose contract implements "
            "read_kv_blocks and write_kv_blocks",
        )
    if lanes > 1:
        raise TTUnsupportedFeatureError(
            f"{setting} with lanes (--data-parallel-size)", lanes, "1 lane",
            f"remove --data-parallel-size or {setting}: the lane scheduler keeps one KV "
            "pool per lane, vLLM's KV connectors one per engine",
        )
    if connector == OFFLOADING:
        spec = kv.kv_connector_extra_config.get("spec_name", SPEC_KEYS["spec_name"])
        if spec != SPEC_KEYS["spec_name"]:
            raise TTUnsupportedFeatureError(
                "--kv-transfer-config kv_connector_extra_config.spec_name", spec, SPEC_KEYS["spec_name"],
                "remove spec_name and spec_module_path: the TT platform selects its own transfer handler",
            )
        select_spec(kv.kv_connector_extra_config)
    else:
        _check_shared_storage(vllm_config, kv, caps, arch)
    select_connector_module(kv)


def _check_shared_storage(vllm_config: VllmConfig, kv: KVTransferConfig, caps: ModelCapabilities, arch: str) -> None:
    """``ExampleConnector`` carries the KV of one cache group, and stores a prompt in the step
    that first schedules it; the decode engine continues from the loaded blocks."""
    kinds = [kind for kind in caps.kv_cache_kinds if kind in NOT_ROUND_TRIPPED_KINDS]
    if kinds:
        raise TTUnsupportedFeatureError(
            f"--kv-transfer-config kv_connector={SHARED_STORAGE} for {arch}", f"KV kinds {kinds}",
            "a model whose KV is full, sliding-window or latent attention only",
            f"serve {arch} without --kv-transfer-config: {SHARED_STORAGE} moves the first KV cache group's "
            "blocks only (vLLM turns the hybrid KV manager off for it)",
        )
    if not caps.supports_prefix_caching:
        raise TTUnsupportedFeatureError(
            f"--kv-transfer-config kv_connector={SHARED_STORAGE} for {arch}", "no supports_prefix_caching",
            "a model whose prefill starts after loaded blocks (supports_prefix_caching)",
            "serve a model that declares supports_prefix_caching",
        )
    if kv.kv_load_failure_policy != "fail":
        raise TTUnsupportedFeatureError(
            "--kv-transfer-config kv_load_failure_policy", kv.kv_load_failure_policy,
            "'fail' (vLLM's default): a request whose blocks did not load fails, the others go on",
            "remove kv_load_failure_policy: the TT runner does not roll a request back to recompute "
            "blocks whose load failed",
        )
    if kv.is_kv_producer and vllm_config.scheduler_config.enable_chunked_prefill:
        raise TTUnsupportedFeatureError(
            f"--enable-chunked-prefill with --kv-transfer-config kv_connector={SHARED_STORAGE} "
            f"kv_role={kv.kv_role}", True, "False on an engine that stores KV (kv_producer, kv_both)",
            f"serve the prefill engine with --no-enable-chunked-prefill: {SHARED_STORAGE} stores a prompt's "
            "KV in the step that first schedules it, so a prompt split over steps would be stored unfinished",
        )


SERVED_CONNECTORS: tuple[str, ...] = (OFFLOADING, SHARED_STORAGE)
"""vLLM KV connectors the TT runner serves (``check_kv_transfer``)."""


def serves_pooling(vllm_config: VllmConfig) -> bool:
    """Whether this engine pools (``--runner pooling``) rather than generates."""
    return vllm_config.model_config.runner_type == "pooling"


SPECULATIVE_METHODS: tuple[str, ...] = ("ngram", "draft_model", "mtp", "eagle3", "custom_class")
"""``--speculative-config`` methods the TT runner serves: vLLM's ``NgramProposer`` on the host,
a drafter checkpoint run as a second program on the mesh (``runner.draft_model``), the
checkpoint's own MTP module run by the model (``runner.mtp``; vLLM maps ``deepseek_mtp``,
``qwen3_5_mtp``, ... to ``mtp``), an EAGLE-3 head run by the model beside it reading the
target's auxiliary hidden states (``runner.eagle3``), and the model's own drafter
(``custom_class`` naming ``MODEL_DRAFTS``)."""

MODEL_DRAFTS = "vllm_tt_platform.runner.model_drafts.ModelDrafts"
"""The ``custom_class`` proposer TT serves (``--speculative-config`` ``model``): the served
model's own drafter (``max_model_drafts``, ``runner.model_drafts``)."""


def check_speculation(vllm_config: VllmConfig, caps: ModelCapabilities, arch: str) -> None:
    """Speculative decoding needs verify steps from the model (an mRoPE model's carry each
    row's rope delta, as its decode steps do)."""
    if vllm_config.speculative_config is None:
        return
    if not caps.supports_verify_decode:
        raise TTUnsupportedFeatureError(
            "--speculative-config", vllm_config.speculative_config.method,
            f"unset for {arch}, whose model_capabilities do not declare supports_verify_decode",
            "remove --speculative-config, or serve a model whose decode_forward runs verify steps "
            "(model contract: VERIFY_KWARG)",
        )
    if vllm_config.speculative_config.method == "mtp":
        _check_mtp(vllm_config.speculative_config, caps, arch)
    if vllm_config.speculative_config.method == "eagle3":
        _check_eagle3(vllm_config, caps, arch)
    if vllm_config.speculative_config.method == "draft_model" and "recurrent_state" in caps.kv_cache_kinds:
        raise TTUnsupportedFeatureError(
            "--speculative-config method", "draft_model",
            f"ngram or mtp for {arch}, a recurrent-state model (a drafter model's pages on such a target "
            "are not proven yet)",
            "use method ngram, or mtp with a checkpoint that ships its MTP module",
        )
    k = vllm_config.speculative_config.num_speculative_tokens or 0
    if vllm_config.speculative_config.method == "custom_class":
        _check_model_drafts(vllm_config.speculative_config, k, caps, arch)
    if caps.max_verify_tokens and 1 + k > caps.max_verify_tokens:
        raise TTConfigError(
            "--speculative-config num_speculative_tokens", k,
            f"at most {caps.max_verify_tokens - 1} for {arch}, whose verify traces hold "
            f"{caps.max_verify_tokens} tokens per row (model_capabilities max_verify_tokens)",
            f"set num_speculative_tokens to {caps.max_verify_tokens - 1} or less",
        )


def check_block_output(vllm_config: VllmConfig, block_tokens: int, caps: ModelCapabilities, arch: str) -> None:
    """``tt.block_tokens`` (adaptive block output) needs a model whose decode step commits
    blocks (``max_block_tokens``) at least that long, and no second speculation beside it."""
    if block_tokens <= 1:
        return
    key = "--additional-config.tt.block_tokens"
    if not caps.max_block_tokens:
        raise TTUnsupportedFeatureError(
            key, block_tokens, f"0 for {arch}, whose model_capabilities do not declare max_block_tokens",
            "remove tt.block_tokens, or serve a model whose decode_forward commits blocks (model contract: "
            "BLOCK_KWARG)",
        )
    if block_tokens > caps.max_block_tokens:
        raise TTConfigError(
            key, block_tokens, f"at most {caps.max_block_tokens} for {arch} (model_capabilities max_block_tokens)",
            f"set tt.block_tokens to {caps.max_block_tokens} or less",
        )
    if vllm_config.speculative_config is not None:
        raise TTUnsupportedFeatureError(
            key, block_tokens, f"0 with --speculative-config method {vllm_config.speculative_config.method}",
            "use one of the two: the model's own block output (tt.block_tokens) or --speculative-config",
        )


def _check_mtp(spec: SpeculativeConfig, caps: ModelCapabilities, arch: str) -> None:
    """``method: mtp`` needs a model class that runs MTP modules and a checkpoint config that
    declares some (vLLM's ``n_predict``, from ``num_nextn_predict_layers`` /
    ``mtp_num_hidden_layers``); the weights themselves are checked when the model loads."""
    if not caps.supports_mtp:
        raise TTUnsupportedFeatureError(
            "--speculative-config method", "mtp",
            f"ngram or draft_model for {arch}, whose model_capabilities do not declare supports_mtp",
            "use method ngram or draft_model, or serve a model whose class runs its MTP module (mtp_forward)",
        )
    draft = spec.draft_model_config
    n_predict = getattr(draft.hf_config, "n_predict", None) if draft is not None else None
    if not n_predict:
        raise TTConfigError(
            "--speculative-config method", "mtp",
            f"a checkpoint with MTP layers; {spec.model}'s config declares none "
            "(num_nextn_predict_layers / mtp_num_hidden_layers unset or 0)",
            "use method ngram or draft_model, or serve a checkpoint that ships MTP weights and declares them",
        )


def _check_eagle3(vllm_config: VllmConfig, caps: ModelCapabilities, arch: str) -> None:
    """``method: eagle3`` needs a model class that runs an EAGLE-3 head beside it, and a head
    made for this target: one layer, ``fc`` over states of the target's hidden size from layers
    it has, drafts in its vocabulary (the weights are checked when the head loads)."""
    spec = vllm_config.speculative_config
    if spec is None:
        return
    if not caps.supports_eagle3:
        raise TTUnsupportedFeatureError(
            "--speculative-config method", "eagle3",
            f"ngram or draft_model for {arch}, whose model_capabilities do not declare supports_eagle3",
            "use method ngram or draft_model, or serve a model whose class runs an EAGLE-3 head (eagle3_forward)",
        )
    target = vllm_config.model_config
    layers = target.get_total_num_hidden_layers()
    head = Eagle3HeadConfig.of(spec.draft_model_config, layers)
    hidden, vocab = target.get_hidden_size(), target.get_vocab_size()
    key = "--speculative-config model"
    fix = f"serve an EAGLE-3 head trained for {target.model}"
    if head.num_layers != 1:
        raise TTConfigError(key, head.folder, f"a one-layer EAGLE-3 head; its config has num_hidden_layers "
                            f"{head.num_layers}", fix)
    if head.target_hidden_size != hidden:
        raise TTConfigError(key, head.folder, f"a head over hidden states of the target's hidden size {hidden}; "
                            f"its config has {head.target_hidden_size} (target_hidden_size or hidden_size)", fix)
    if head.vocab_size != vocab or head.draft_vocab_size > vocab:
        raise TTConfigError(key, head.folder, f"a head drafting in the target's vocabulary of {vocab} ids; its config "
                            f"has vocab_size {head.vocab_size}, draft_vocab_size {head.draft_vocab_size}", fix)
    if not all(0 <= i <= layers for i in head.aux_layer_ids):
        raise TTConfigError(key, head.folder, f"eagle_aux_hidden_state_layer_ids in [0, {layers}] (the target's "
                            f"layers); its config names {list(head.aux_layer_ids)}", fix)


def _check_model_drafts(spec: SpeculativeConfig, k: int, caps: ModelCapabilities, arch: str) -> None:
    """``method: custom_class`` on TT is the model's own drafter: the proposer must be
    ``MODEL_DRAFTS`` (vLLM's GPU runner would import any class; TT runs the model's program),
    and the model must draft at least K tokens (``max_model_drafts``)."""
    key = "--speculative-config model"
    if spec.model != MODEL_DRAFTS:
        raise TTUnsupportedFeatureError(
            key, spec.model, MODEL_DRAFTS,
            f"custom_class on TT runs the served model's own drafter: set model to {MODEL_DRAFTS}, or use "
            "method ngram, draft_model or mtp (docs/speculative-decoding.md)",
        )
    if not caps.max_model_drafts:
        raise TTUnsupportedFeatureError(
            key, spec.model, f"another method for {arch}, whose model_capabilities do not declare max_model_drafts",
            "use method ngram or draft_model, or serve a model that drafts for itself (model contract: "
            "propose_drafts)",
        )
    if k > caps.max_model_drafts:
        raise TTConfigError(
            "--speculative-config num_speculative_tokens", k,
            f"at most {caps.max_model_drafts} for {arch}, whose own drafter proposes that many per row "
            "(model_capabilities max_model_drafts)",
            f"set num_speculative_tokens to {caps.max_model_drafts} or less",
        )


def check_capabilities(
    config: TTConfig, caps: ModelCapabilities, arch: str, *, async_requested: bool,
    prefix_caching_requested: bool,
) -> None:
    """Options that need the model to declare a capability.

    ``*_requested`` is true only for an explicit command-line option; vLLM's own defaults are
    switched off by the caller instead.
    """
    if config.sample_on_device_mode is not None and not caps.supports_sample_on_device:
        raise TTUnsupportedFeatureError(
            "--additional-config.tt.sample_on_device_mode", config.sample_on_device_mode,
            f"unset for {arch}, whose model_capabilities do not declare supports_sample_on_device",
            "remove sample_on_device_mode or serve a model that samples on device",
        )
    if async_requested and not caps.supports_async_decode:
        raise TTUnsupportedFeatureError(
            "--async-scheduling", True,
            f"off for {arch}, whose model_capabilities do not declare supports_async_decode",
            "remove --async-scheduling",
        )
    if prefix_caching_requested and not caps.supports_prefix_caching:
        raise TTUnsupportedFeatureError(
            "--enable-prefix-caching", True,
            f"off for {arch}, whose model_capabilities do not declare supports_prefix_caching",
            "remove --enable-prefix-caching, or serve a model whose contract declares supports_prefix_caching",
        )
    if config.trace_mode != "none" and not config.enable_model_warmup:
        raise TTConfigError(
            "--additional-config.tt.enable_model_warmup", False,
            "true while trace_mode captures traces (traces are captured during warmup)",
            "set enable_model_warmup true, or trace_mode none",
        )



def restrict_modalities(vllm_config: VllmConfig, arch: str, served: tuple[str, ...],
                        chunked_items: bool = False) -> None:
    """A multimodal model takes the modalities it declares (``ModelCapabilities.modalities``)
    only: a ``--limit-mm-per-prompt`` asking for another is refused; the others (video, audio)
    get a limit of 0, so vLLM's own front end answers such a request with a 400 instead of the
    engine failing on it. An item's placeholder tokens are split over two prefill chunks
    (``disable_chunked_mm_input`` off) only for a model declaring ``chunked_mm_input``
    (``chunked_items``): the contract sends items whole, with every pass of their row."""
    model = vllm_config.model_config
    mm = None if model is None else model.multimodal_config
    if mm is None:
        return
    if mm.enable_mm_embeds:
        raise TTUnsupportedFeatureError(
            "--enable-mm-embeds", True, "off (TT models run their own vision encoder on the image)",
            "remove --enable-mm-embeds and send images",
        )
    asked = {m: opts.count for m, opts in mm.limit_per_prompt.items()
             if m not in served and opts.count > 0}
    if asked:
        raise TTUnsupportedFeatureError(
            "--limit-mm-per-prompt", asked, f"counts for {', '.join(served)} only",
            f"remove the other modalities from --limit-mm-per-prompt: {arch} takes "
            f"{', '.join(served)} only",
        )
    from vllm.config.multimodal import AudioDummyOptions, VideoDummyOptions

    if "video" not in served:
        mm.limit_per_prompt["video"] = VideoDummyOptions(count=0, num_frames=None, width=None, height=None)
    if "audio" not in served:
        mm.limit_per_prompt["audio"] = AudioDummyOptions(count=0, length=None)
    vllm_config.scheduler_config.disable_chunked_mm_input = not chunked_items


def check_mixed_steps(vllm_config: VllmConfig, config: TTConfig, caps: ModelCapabilities, arch: str) -> None:
    """``tt.mixed_steps`` needs a model that captures mixed programs (``mixed_shapes``) and no
    verify or block steps (a mixed step's decode half is a plain decode's). In lanes, one lane's
    chunk runs beside every lane's decodes (``lanes.coordinator``). ``tt.itl_slo_ms`` sizes mixed steps'
    chunks by modelled time, so it needs both ``tt.mixed_steps`` and ``tt.step_cost``."""
    if config.itl_slo_ms and not (config.mixed_steps and config.step_cost):
        missing = " and ".join(name for name, on in (("tt.mixed_steps", config.mixed_steps),
                                                     ("tt.step_cost", config.step_cost)) if not on)
        raise TTUnsupportedFeatureError(
            "--additional-config.tt.itl_slo_ms", config.itl_slo_ms, f"0 without {missing}",
            f"set {missing} (e.g. tt.step_cost served): the ITL target sizes mixed steps' prompt chunks "
            "by the step cost model's time, or remove tt.itl_slo_ms",
        )
    if not config.mixed_steps:
        return
    key = "--additional-config.tt.mixed_steps"
    if not caps.mixed_shapes:
        raise TTUnsupportedFeatureError(
            key, True, f"false for {arch}, whose model_capabilities declare no mixed_shapes",
            "remove tt.mixed_steps, or serve a model whose mixed_forward runs decode rows and a prompt chunk "
            "(model contract: MIXED_KWARGS)",
        )
    if vllm_config.speculative_config is not None:
        raise TTUnsupportedFeatureError(
            key, True, f"false with --speculative-config method {vllm_config.speculative_config.method}",
            "use one of the two: verify steps stay phase-pure",
        )
    if config.block_tokens > 1:
        raise TTUnsupportedFeatureError(
            key, True, f"false with --additional-config.tt.block_tokens {config.block_tokens}",
            "use one of the two: block-output steps stay phase-pure",
        )
