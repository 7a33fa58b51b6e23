"""``HostFamily``: what one family subpackage declares, and the registry table built from them.

A family's ``__init__`` holds its declaration (no torch: the model registry reads the table
through an entry point and imports a class only when it serves it); ``HOST_MODELS`` is
``host_models(FAMILIES)``, never written by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_tt_host.models.frame.shapes import (
    MAX_BLOCK_TOKENS,
    MAX_VERIFY_TOKENS,
    MIXED_SHAPES,
    PREFILL_BUCKETS,
)

DECODER: Mapping[str, Any] = {
    "supports_sample_on_device": True, "supports_async_decode": True, "supports_prefix_caching": True,
    "supports_kv_transfer": True, "single_program_lanes": True, "supports_prompt_logprobs": True, "supports_verify_decode": True,
    "prefill_trace_lens": list(PREFILL_BUCKETS), "max_verify_tokens": MAX_VERIFY_TOKENS,
}
"""What a decoder on the frame declares in ``model_capabilities`` (its non-default flags)."""

SELF_DRAFTING: Mapping[str, Any] = {"max_block_tokens": MAX_BLOCK_TOKENS, "max_model_drafts": MAX_VERIFY_TOKENS - 1}
"""What a decoder whose every layer is attention adds: block output drafted by its own first
layers, and the same drafter for vLLM's verify steps (``block_output``)."""

MIXED: Mapping[str, Any] = {"mixed_shapes": [list(shape) for shape in MIXED_SHAPES]}
"""What a text decoder whose layers are the frame's hooks adds: mixed steps (``mixed``), one
walk over its layers running ``_decode_layer`` and ``_prefill_layer`` for each."""

EAGLE3: Mapping[str, Any] = {"supports_eagle3": True}
"""What a decoder running the frame's layer stacks adds: an EAGLE-3 head beside it, reading the
residual streams those stacks capture (``eagle3``)."""

SLIDING: Mapping[str, Any] = {**DECODER, "kv_cache_kinds": ["full_attention", "sliding_window"]}
"""A decoder with sliding-window and full layers (hybrid KV)."""


def decoder_without(*flags: str) -> dict[str, Any]:
    """``DECODER`` less ``flags`` (a family that does not offer them)."""
    return {k: v for k, v in DECODER.items() if k not in flags}


@dataclass(frozen=True)
class HostFamily:
    """One family: the TT architectures it serves and where their tiny checkpoints come from."""

    package: str
    """The family's subpackage (its ``__name__``)."""
    models: Mapping[str, str]
    """TT architecture name -> ``"module:Class"`` inside ``package``."""
    tiny: tuple[str, ...]
    """The tiny checkpoints the parity tests build: ``vllm-tt-tiny-model --arch`` values
    (``vllm_tt_host.tiny``), or the ``vllm_tt_testing`` module of a vision-language recipe."""
    capabilities: Mapping[str, Mapping[str, Any]]
    """TT architecture name -> what its class declares in ``model_capabilities``, stated here so
    that ``vllm-tt-models list --backend host`` imports no torch (tests/test_host_source.py fails
    when a class and its statement disagree)."""

    def __post_init__(self) -> None:
        if set(self.capabilities) != set(self.models):
            raise ValueError(f"{self.package}: state the capabilities of exactly its models "
                             f"{sorted(self.models)}, not {sorted(self.capabilities)}")

    def targets(self) -> dict[str, str]:
        """TT architecture name -> ``"package.module:Class"``."""
        return {arch: f"{self.package}.{target}" for arch, target in self.models.items()}


def host_source(families: Iterable[HostFamily]) -> dict[str, dict[str, Any]]:
    """The ``vllm_tt.model_sources`` table of ``families``: each target with its stated capabilities."""
    families = tuple(families)
    stated = {arch: caps for family in families for arch, caps in family.capabilities.items()}
    return {arch: {"target": target, "capabilities": dict(stated[arch])} for arch, target in host_models(families).items()}


def host_models(families: Iterable[HostFamily]) -> dict[str, str]:
    """The registry table of ``families``, in order; an architecture two families claim is an error."""
    table: dict[str, str] = {}
    for family in families:
        for arch, target in family.targets().items():
            if arch in table:
                raise ValueError(f"{arch} is declared by {table[arch]} and {target}; one family serves it")
            table[arch] = target
    return table
