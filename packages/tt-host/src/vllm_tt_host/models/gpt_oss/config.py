"""``GptOssConfig``: the decoder numbers plus what GPT-OSS adds (experts, YaRN, per-layer
windows), read from an HF ``gpt_oss`` config.

The sliding layers are the ones ``layer_types`` names (transformers and vLLM both put them on
the even layers); a checkpoint whose weights are quantized (MXFP4) is refused, since the host
math runs float32 weights only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.config import (
    AttentionShape,
    DecoderConfig,
    RopeConfig,
    common_fields,
    layer_windows,
    model_name,
    positive_int,
)
from vllm_tt_host.models.frame.moe import MoeConfig
from vllm_tt_host.models.frame.yarn import YarnScaling

ROPE_TYPES: tuple[str, ...] = ("default", "yarn")


@dataclass(frozen=True)
class GptOssConfig(DecoderConfig):
    moe: MoeConfig = field(kw_only=True)
    yarn: YarnScaling | None = field(kw_only=True, default=None)
    """None: plain rotary frequencies (``rope_type`` default)."""

    @classmethod
    def from_gpt_oss(cls, hf_config: Any, *, n_layers: int | None = None) -> GptOssConfig:
        model = model_name(hf_config)
        quant = getattr(hf_config, "quantization_config", None)
        if quant:
            raise TTUnsupportedFeatureError(
                f"{model}: quantization_config",
                quant,
                "none (float weights)",
                "the host GPT-OSS runs unquantized weights; use a checkpoint saved without MXFP4",
            )
        shape = AttentionShape.read(hf_config, n_layers=n_layers, head_dim_required=True)
        windows = layer_windows(hf_config, model, shape.num_layers)
        experts = positive_int(hf_config, "num_local_experts", model)
        top_k = positive_int(hf_config, "num_experts_per_tok", model)
        if top_k > experts:
            raise TTConfigError(
                f"{model}: num_experts_per_tok", top_k, f"at most num_local_experts={experts}",
                "check the checkpoint's config.json",
            )
        max_positions = int(getattr(hf_config, "max_position_embeddings", 0) or 0)
        rope, yarn = _rope(hf_config, model, max_positions)
        bias = bool(getattr(hf_config, "attention_bias", True))
        return cls(
            **common_fields(hf_config, shape, rms_norm_eps=1e-5),
            family="gpt_oss",
            rope=rope,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=True,
            qk_norm=False,
            layer_windows=windows,
            moe=MoeConfig(
                num_experts=experts,
                top_k=top_k,
                swiglu_alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
                swiglu_limit=float(getattr(hf_config, "swiglu_limit", 7.0)),
            ),
            yarn=yarn,
        )


def _rope(hf_config: Any, model: str, max_positions: int) -> tuple[RopeConfig, YarnScaling | None]:
    params = getattr(hf_config, "rope_parameters", None)
    if not isinstance(params, Mapping) or "rope_theta" not in params:
        raise TTConfigError(
            f"{model}: rope_parameters", params, "one mapping with rope_theta",
            "check the checkpoint's config.json",
        )
    rope_type = params.get("rope_type", "default") or "default"
    if rope_type not in ROPE_TYPES:
        raise TTUnsupportedFeatureError(
            f"{model}: rope_type", rope_type, f"one of {', '.join(ROPE_TYPES)}", "use a default or yarn rope"
        )
    if float(params.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise TTUnsupportedFeatureError(
            f"{model}: partial_rotary_factor", params["partial_rotary_factor"], "1.0",
            "host reference models rotate the whole head",
        )
    theta = float(params["rope_theta"])
    if rope_type == "default":
        return RopeConfig(theta=theta), None
    yarn = YarnScaling.from_rope_parameters(params, max_positions, model)
    rope = RopeConfig(
        theta=theta, rope_type="yarn", factor=yarn.factor,
        original_max_position_embeddings=yarn.original_max_position_embeddings,
    )
    return rope, yarn
