"""The builtin table: every model family the product serves, as lazy tt-metal targets.

Targets are ``module:Class`` strings into tt-metal's ``models`` package; nothing is imported
until a model is actually used. One registration serves every release of a family (the
architecture, not the checkpoint name, selects the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vllm_tt_models_registry.envs import TT_LLAMA_TEXT_VER, TT_QWEN3_TEXT_VER, EnvVar

_TT_TRANSFORMERS = "models.tt_transformers.tt.generator_vllm"
_GALAXY = "models.demos.llama3_70b_galaxy.tt.generator_vllm"

_LANES: Mapping[str, Any] = MappingProxyType({"single_program_lanes": True})
"""Declared for models that run one program over the whole mesh with a KV cache per lane.
tt-metal's classes do not declare this key yet, so the table states it for them."""

_SLIDING = ("full_attention", "sliding_window")
"""KV kinds of the families interleaving sliding-window and global layers (``kv_cache_kinds``,
stated here too: tt-metal's classes do not declare it)."""


@dataclass(frozen=True)
class BuiltinTarget:
    """Where one variant of a family lives, and capabilities the registration adds."""

    target: str
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    """Merged over the class's own ``model_capabilities`` (these win)."""


@dataclass(frozen=True)
class BuiltinFamily:
    """A model family: the HF architectures it serves and its implementation(s)."""

    name: str
    archs: tuple[str, ...]
    variants: Mapping[str, BuiltinTarget]
    """Keyed by variant name; a family without a selector has the single key ``default``."""
    selector: EnvVar[str] | None = None

    def chosen(self, environ: Mapping[str, str] | None) -> BuiltinTarget:
        """The variant the environment selects (validated by the selector's parser)."""
        if self.selector is None:
            return self.variants["default"]
        return self.variants[self.selector.read(environ)]


def _one(target: str, **capabilities: Any) -> Mapping[str, BuiltinTarget]:
    return {"default": BuiltinTarget(target, capabilities)}


BUILTIN_FAMILIES: tuple[BuiltinFamily, ...] = (
    BuiltinFamily(
        "Llama 3.1 / 3.2 / 3.3",
        ("LlamaForCausalLM",),
        {
            "tt_transformers": BuiltinTarget(f"{_TT_TRANSFORMERS}:LlamaForCausalLM"),
            "llama3_70b_galaxy": BuiltinTarget(f"{_GALAXY}:LlamaForCausalLM", _LANES),
        },
        TT_LLAMA_TEXT_VER,
    ),
    BuiltinFamily(
        "Llama 3.2 Vision",
        ("MllamaForConditionalGeneration",),
        _one(f"{_TT_TRANSFORMERS}:MllamaForConditionalGeneration"),
    ),
    BuiltinFamily("Qwen 2.5", ("Qwen2ForCausalLM",), _one(f"{_TT_TRANSFORMERS}:QwenForCausalLM")),
    BuiltinFamily(
        "Qwen 3",
        ("Qwen3ForCausalLM",),
        {
            "tt_transformers": BuiltinTarget(f"{_TT_TRANSFORMERS}:QwenForCausalLM"),
            "qwen3_32b_galaxy": BuiltinTarget(f"{_GALAXY}:QwenForCausalLM", _LANES),
        },
        TT_QWEN3_TEXT_VER,
    ),
    BuiltinFamily(
        "Qwen 3.5 / 3.6",
        ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
        _one("models.demos.blackhole.qwen36.tt.qwen36_vllm:Qwen36ForCausalLM",
             kv_cache_kinds=("full_attention", "recurrent_state")),
    ),
    BuiltinFamily(
        "Qwen2.5-VL",
        ("Qwen2_5_VLForConditionalGeneration",),
        _one("models.demos.qwen25_vl.tt.generator_vllm:Qwen2_5_VLForConditionalGeneration"),
    ),
    BuiltinFamily(
        "Qwen3-VL",
        ("Qwen3VLForConditionalGeneration",),
        _one("models.demos.qwen3_vl.tt.generator_vllm:Qwen3VLForConditionalGeneration"),
    ),
    BuiltinFamily("Mistral", ("MistralForCausalLM",), _one(f"{_TT_TRANSFORMERS}:MistralForCausalLM")),
    BuiltinFamily(
        "Mistral 3",
        ("Mistral3ForConditionalGeneration",),
        _one(f"{_TT_TRANSFORMERS}:Mistral3ForConditionalGeneration"),
    ),
    BuiltinFamily(
        "Gemma 3",
        ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
        _one(f"{_TT_TRANSFORMERS}:Gemma3ForConditionalGeneration", kv_cache_kinds=_SLIDING),
    ),
    BuiltinFamily(
        "Gemma 4",
        (
            "Gemma4ForCausalLM",
            "Gemma4ForConditionalGeneration",
            "Gemma4UnifiedForConditionalGeneration",
        ),
        _one("models.demos.gemma4.tt.generator_vllm:Gemma4ForCausalLM", kv_cache_kinds=_SLIDING),
    ),
    BuiltinFamily(
        "DeepSeek V3",
        ("DeepseekV3ForCausalLM",),
        _one("models.demos.deepseek_v3.tt.generator_vllm:DeepseekV3ForCausalLM", kv_cache_kinds=("mla",)),
    ),
    BuiltinFamily(
        "GPT-OSS",
        ("GptOssForCausalLM",),
        _one(f"{_TT_TRANSFORMERS}:GptOssForCausalLM", **_LANES, kv_cache_kinds=_SLIDING),
    ),
)
