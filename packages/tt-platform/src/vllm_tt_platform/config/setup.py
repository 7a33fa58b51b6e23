"""Turns a vLLM config into a TT setup: options parsed, model resolved, topology chosen.

``configure`` runs from ``TTPlatform.check_and_update_config`` in every vLLM process (front end
and engine core), so it is idempotent; ``resolve_setup`` is the pure part the worker reuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm_tt_models_registry import RegisteredModel, TTModelRegistry, load_registry, tt_arch_name
from vllm_tt_models_registry.contract import ModelCapabilities
from vllm_tt_scheduler import record_mixed_shapes, record_prefill_trace_lens
from vllm_tt_scheduler.lanes.shape import LaneShape

from vllm_tt_platform.config import cli_flags, data_parallel, metrics_switch, request_checks
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.pooling_shapes import pooling_shapes_of
from vllm_tt_platform.config.startup_checks import (
    apply_enforce_eager,
    check_block_output,
    check_capabilities,
    check_encoder_decoder,
    check_environment,
    check_kv_transfer,
    check_mixed_steps,
    check_runner,
    check_speculation,
    check_vllm_features,
    restrict_modalities,
    serves_pooling,
)
from vllm_tt_platform.config.step_cost import hand_step_cost
from vllm_tt_platform.config.unimplemented import refuse_unimplemented
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.backend import find_backend
from vllm_tt_platform.mesh.shape import mesh_request
from vllm_tt_platform.mesh.topology import Topology

if TYPE_CHECKING:
    from vllm.config import CacheConfig, VllmConfig

logger = init_logger("vllm." + __name__)

WORKER_CLS = "vllm_tt_platform.worker.TTWorker"
SCHEDULER_CLS = "vllm_tt_scheduler.TTScheduler"
ASYNC_SCHEDULER_CLS = "vllm_tt_scheduler.TTAsyncScheduler"
LANE_SCHEDULER_CLS = "vllm_tt_scheduler.TTLaneCoordinator"
DEFAULT_BLOCK_SIZE = 64
"""tt-metal's paged attention works in tiles of 32 tokens; 64 is what its examples use."""


@dataclass(frozen=True)
class TTSetup:
    config: TTConfig
    model: RegisteredModel
    capabilities: ModelCapabilities
    topology: Topology
    drafter: RegisteredModel | None = None
    """The class serving ``--speculative-config``'s drafter checkpoint (``method: draft_model``)."""


def tt_section(vllm_config: VllmConfig) -> dict[str, Any]:
    """The ``tt`` part of ``--additional-config`` (a dict, created if absent)."""
    extra = vllm_config.additional_config
    if not isinstance(extra, dict):
        raise TTConfigError("--additional-config", extra, "a JSON object", "pass --additional-config '{\"tt\": {...}}'")
    tt = extra.setdefault("tt", {})
    if not isinstance(tt, dict):
        raise TTConfigError(
            "--additional-config.tt", tt, "a JSON object of TT options",
            "pass options as --additional-config.tt.<key> <value>",
        )
    return tt


def resolve_setup(vllm_config: VllmConfig, environ: Mapping[str, str] | None = None) -> TTSetup:
    tt = tt_section(vllm_config)
    config = TTConfig.from_sources(tt, environ)
    hf_config = vllm_config.model_config.hf_config
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs:
        raise TTConfigError(
            "--model", vllm_config.model_config.model, "a checkpoint whose config.json lists `architectures`",
            "add the Hugging Face architecture name to config.json",
        )
    find_backend(config.mesh_backend)  # a backend no installed distribution registers fails here, named
    registry = load_registry(config.mesh_backend, environ=environ)
    model = registry.resolve(tt_arch_name(archs[0]))
    capabilities = model.capabilities()
    return TTSetup(config, model, capabilities, _topology(vllm_config, environ), _drafter(vllm_config, registry))


def _drafter(vllm_config: VllmConfig, registry: TTModelRegistry) -> RegisteredModel | None:
    """The registry's class for a ``draft_model`` drafter checkpoint (one of the served families)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    draft = spec.draft_model_config
    archs = list(getattr(draft.hf_config, "architectures", None) or [])
    if not archs:
        raise TTConfigError(
            "--speculative-config model", draft.model, "a checkpoint whose config.json lists `architectures`",
            "add the Hugging Face architecture name to the drafter's config.json",
        )
    return registry.resolve(tt_arch_name(archs[0]))


def _topology(vllm_config: VllmConfig, environ: Mapping[str, str] | None = None) -> Topology:
    """The mesh this engine opens (its host's, or its rank's share of it) and its lanes."""
    mesh = mesh_request(environ)
    rank = data_parallel.host_rank(vllm_config)
    if rank is not None:
        mesh = rank.mesh(mesh, environ)
    shape = LaneShape.from_tt_section(tt_section(vllm_config))  # validated: the platform wrote it
    if shape is None:
        return Topology(mesh, 1, vllm_config.scheduler_config.max_num_seqs)
    return Topology(mesh, shape.lanes, shape.rows_per_lane)


def register_with_vllm(setup: TTSetup) -> None:
    """Make vLLM's model registry serve the TT architecture from the class this setup chose.

    The registry plugin registers every TT architecture before any config exists, from the
    environment alone (``TT_MESH_BACKEND``); the mesh backend itself is chosen once, in
    ``TTConfig``, where ``--additional-config.tt.mesh_backend`` wins over the environment. This
    brings vLLM's entry for the served architecture in line with that choice, in every process
    that configures vLLM."""
    import vllm

    vllm.ModelRegistry.register_model(setup.model.arch, setup.model.target)
    logger.debug("%s registered with vLLM as %s (mesh backend %r, %s)", setup.model.arch,
                 setup.model.target, setup.config.mesh_backend, setup.config.provenance.get("mesh_backend"))


def configure(vllm_config: VllmConfig) -> None:
    check_environment()
    if vllm_config.model_config is None:
        return
    check_vllm_features(vllm_config)
    refuse_unimplemented(vllm_config)
    metrics_switch.enable_tt_metrics()
    eager = apply_enforce_eager(vllm_config, tt_section(vllm_config))
    if eager:
        logger.info_once(eager)
    setup = resolve_setup(vllm_config)
    restrict_modalities(vllm_config, setup.model.arch, setup.capabilities.modalities,
                        setup.capabilities.chunked_mm_input)
    register_with_vllm(setup)
    data_parallel.fold(vllm_config, setup.capabilities.single_program_lanes, setup.model.arch)
    setup = replace(setup, topology=_topology(vllm_config))
    tt = tt_section(vllm_config)
    caps = setup.capabilities
    scheduler = vllm_config.scheduler_config
    cache = vllm_config.cache_config

    # Only the CLI can tell an explicit request from vLLM's default (see cli_flags); with
    # vllm.LLM(...) an unsupported async scheduling or prefix caching is switched off below.
    check_capabilities(
        setup.config, caps, setup.model.arch,
        async_requested=bool(scheduler.async_scheduling) and cli_flags.given("async_scheduling"),
        prefix_caching_requested=bool(cache.enable_prefix_caching)
        and cli_flags.given("enable_prefix_caching"),
    )
    check_runner(vllm_config, caps, setup.model.arch)
    check_encoder_decoder(vllm_config, caps, setup.model.arch)
    check_kv_transfer(vllm_config, caps, setup.model.arch, setup.topology.lanes)
    check_speculation(vllm_config, caps, setup.model.arch)
    check_block_output(vllm_config, setup.config.block_tokens, caps, setup.model.arch)
    check_mixed_steps(vllm_config, setup.config, caps, setup.model.arch)
    if vllm_config.speculative_config is not None:
        logger.info("Speculative decoding (%s): async decode overlap off (vLLM schedules drafts "
                    "synchronously: each step's drafts need the tokens the step before accepted).",
                    vllm_config.speculative_config.method)
    pooling = serves_pooling(vllm_config)
    pooling_max_len = None
    if pooling:
        pooling_max_len = pooling_shapes_of(vllm_config, setup.config.pooling_shapes).max_length
        _prefill_only(vllm_config, pooling_max_len)
    request_checks.install(
        request_checks.RequestRules.of(setup.model.arch, caps, _image_tokens_per_pass(vllm_config, caps),
                                       pooling_max_len)
    )
    if vllm_config.speculative_config is not None and scheduler.async_scheduling:
        # vLLM keeps async scheduling on for draft_model (its GPU runner drafts inside the
        # step); the TT runner drafts between steps, which only a synchronous engine asks for.
        if cli_flags.given("async_scheduling"):
            raise TTUnsupportedFeatureError(
                "--async-scheduling", True,
                f"off with --speculative-config method {vllm_config.speculative_config.method}",
                "remove --async-scheduling (drafts are proposed between steps on TT)",
            )
        logger.info("Async scheduling off: speculative decoding (%s) proposes drafts between steps.",
                    vllm_config.speculative_config.method)
        scheduler.async_scheduling = False
    if setup.config.block_tokens > 1 and scheduler.async_scheduling:
        # vLLM's async scheduler counts one token in flight per row; a block step commits several.
        if cli_flags.given("async_scheduling"):
            raise TTUnsupportedFeatureError(
                "--async-scheduling", True, f"off with --additional-config.tt.block_tokens {setup.config.block_tokens}",
                "remove --async-scheduling (a block step's tokens are read back before the next step is scheduled)",
            )
        logger.info("Async scheduling off: block output (tt.block_tokens=%d) commits a variable number of "
                    "tokens per row, read back in the step.", setup.config.block_tokens)
        scheduler.async_scheduling = False
    if scheduler.async_scheduling and pooling:
        logger.info("Async scheduling off: a pooling step has no decode to overlap.")
        scheduler.async_scheduling = False
    if scheduler.async_scheduling and not caps.supports_async_decode:
        logger.info("Async scheduling off: %s does not declare supports_async_decode.", setup.model.arch)
        scheduler.async_scheduling = False

    if cache.enable_prefix_caching and not caps.supports_prefix_caching:
        logger.info("Prefix caching off: %s does not declare supports_prefix_caching.", setup.model.arch)
        cache.enable_prefix_caching = False
    if cache.enable_prefix_caching and vllm_config.speculative_config is not None \
            and "recurrent_state" in caps.kv_cache_kinds:
        _no_state_caching_with_drafts(setup.model.arch)
        cache.enable_prefix_caching = False
    if not cache.enable_prefix_caching and cache.mamba_cache_mode != "none":
        # vLLM chose its recurrent-state caching mode for prefix caching before it was turned off.
        cache.mamba_cache_mode = "none"
        cache.mamba_block_size = vllm_config.model_config.max_model_len
    # vLLM gives the state blocks its own block size unless the user chose one.
    state_block = None if cache.mamba_block_size in (None, cache.block_size) else cache.mamba_block_size
    if not cache.user_specified_block_size and cache.block_size != DEFAULT_BLOCK_SIZE:
        cache.block_size = DEFAULT_BLOCK_SIZE
    if cache.mamba_cache_mode == "align":
        _state_boundaries(cache, state_block)

    hf_config = vllm_config.model_config.hf_config
    hf_config.architectures = [tt_arch_name(a) for a in hf_config.architectures or []]
    if caps.prefill_trace_lens and not pooling:  # pooling prompts run whole, at pool shapes
        record_prefill_trace_lens(tt, caps.prefill_trace_lens)
    if setup.config.step_cost is not None:
        hand_step_cost(tt, setup.config.step_cost, hf_config, setup.topology)
    if setup.config.mixed_steps:
        record_mixed_shapes(tt, caps.mixed_shapes)

    vllm_config.parallel_config.worker_cls = WORKER_CLS
    if setup.topology.lanes > 1:
        scheduler.scheduler_cls = LANE_SCHEDULER_CLS
    else:
        scheduler.scheduler_cls = ASYNC_SCHEDULER_CLS if scheduler.async_scheduling else SCHEDULER_CLS
    # A pooling prompt runs whole; a generation model chunks unless the user turned it off
    # (vLLM's own default is on: off is always the user's choice).
    scheduler.enable_chunked_prefill = scheduler.enable_chunked_prefill and not pooling


def _no_state_caching_with_drafts(arch: str) -> None:
    """A recurrent-state model speculates in vLLM's ``none`` state mode: a request's ``1 + K``
    state blocks hold the state after each verify position (``KVGroup.state_slots``), where
    ``align`` mode would cache one per KV block. An explicit ``--enable-prefix-caching`` is an
    error; vLLM's default is switched off."""
    if cli_flags.given("enable_prefix_caching"):
        raise TTUnsupportedFeatureError(
            "--enable-prefix-caching", True,
            f"off with --speculative-config for {arch}, a recurrent-state model (its verify steps keep one "
            "state per draft position, not one per KV block)",
            "remove --enable-prefix-caching, or --speculative-config",
        )
    logger.info("Prefix caching off: speculative decoding on %s (recurrent state) keeps 1 + K state slots per "
                "request, one per verify position.", arch)


def _state_boundaries(cache: CacheConfig, state_block: int | None) -> None:
    """Prefix caching of a recurrent-state model (vLLM's ``align`` mode): a state per attention
    block, so vLLM's state block size follows the TT block size (``state_block``: the one the
    user gave). A ``--prefix-match-unit`` below it would make vLLM copy a state block on a hit
    inside a block, which the TT runner does not do."""
    if state_block not in (None, cache.block_size):
        raise TTUnsupportedFeatureError(
            "--mamba-block-size", state_block,
            f"the block size ({cache.block_size}): the TT runner keeps a recurrent state per KV block",
            "remove --mamba-block-size (or pass --block-size with the same value)",
        )
    cache.mamba_block_size = cache.block_size
    match_unit = getattr(cache, "prefix_match_unit", None)  # vLLM 0.33+
    if match_unit not in (None, cache.block_size):
        raise TTUnsupportedFeatureError(
            "--prefix-match-unit", match_unit,
            f"the block size ({cache.block_size}) with prefix caching of a recurrent-state model",
            "remove --prefix-match-unit (hits land on block boundaries, where the states are cached)",
        )


def _prefill_only(vllm_config: VllmConfig, max_len: int) -> None:
    """A pooling model runs each prompt whole in one prefill step: no chunking, no prefix cache
    (no KV cache), no decode to overlap; a step must hold the longest shape's prompt: vLLM's
    default step budget is raised to it (as vLLM does with chunked prefill off), a budget the
    user gave below it is an error."""
    sched = vllm_config.scheduler_config
    if sched.max_num_batched_tokens < max_len:
        if cli_flags.given("max_num_batched_tokens"):
            raise TTConfigError(
                "--max-num-batched-tokens", sched.max_num_batched_tokens,
                f"at least the longest pooling shape ({max_len} tokens: pooling prompts are never chunked)",
                f"pass --max-num-batched-tokens {max_len} or more, or shorten --additional-config.tt.pooling_shapes",
            )
        logger.info("Step budget %d tokens (was vLLM's default %d): the longest pooling shape, as pooling "
                    "prompts are never chunked.", max_len, sched.max_num_batched_tokens)
        sched.max_num_batched_tokens = max_len
    vllm_config.cache_config.enable_prefix_caching = False
    sched.async_scheduling = False


def _image_tokens_per_pass(vllm_config: VllmConfig, caps: ModelCapabilities) -> int | None:
    """The longest image span one prefill chunk can hold (``RequestRules.image_tokens_per_pass``):
    vLLM's step budget, its per-request chunk limit when set, the model's largest prefill trace;
    None when images are not served or may be chunked (``restrict_modalities`` turns
    ``disable_chunked_mm_input`` on)."""
    sched = vllm_config.scheduler_config
    if vllm_config.model_config.multimodal_config is None or not sched.disable_chunked_mm_input:
        return None
    limits = [sched.max_num_batched_tokens]
    if sched.long_prefill_token_threshold > 0:
        limits.append(sched.long_prefill_token_threshold)
    if caps.prefill_trace_lens:
        limits.append(max(caps.prefill_trace_lens))
    return min(limits)
