"""``GptOssConfig``: the decoder numbers plus what GPT-OSS adds (experts, YaRN, per-layer
windows), read from an HF ``gpt_oss`` config.

The sliding layers are the ones ``layer_types`` names (transformers and vLLM both put them on
the even layers); a checkpoint whose weights are quantized (MXFP4) is refused, since the host
math runs float32 weights only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.config import (
    AttentionShape,
    DecoderConfig,
    common_fields,
    layer_windows,
    model_name,
    positive_int,
    refuse_unimplemented,
)
from vllm_tt_host.models.frame.moe import MoeConfig
from vllm_tt_host.models.frame.rope_config import read_rope

ROPE_TYPES: tuple[str, ...] = ("default", "yarn")


@dataclass(frozen=True)
class GptOssConfig(DecoderConfig):
    moe: MoeConfig = field(kw_only=True)

    @classmethod
    def read(cls, hf_config: Any, family: str = "gpt_oss", *, n_layers: int | None = None) -> GptOssConfig:
        model = model_name(hf_config)
        refuse_unimplemented(hf_config, model, {"quantization_config": (
            "none (float weights)", "the host GPT-OSS runs unquantized weights; use a checkpoint saved without MXFP4",
        )})
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
        rope = read_rope(hf_config, model, ROPE_TYPES, theta=None, max_positions=max_positions)
        return cls(
            **common_fields(hf_config, shape, family=family, rope=rope, qk_norm=False, mlp_bias=True,
                            attention_bias=True, rms_norm_eps=1e-5),
            layer_windows=windows,
            moe=MoeConfig(
                num_experts=experts,
                top_k=top_k,
                swiglu_alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
                swiglu_limit=float(getattr(hf_config, "swiglu_limit", 7.0)),
            ),
        )
