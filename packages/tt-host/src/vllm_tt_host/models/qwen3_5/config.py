"""``Qwen3_5Config``: the decoder numbers plus what Qwen 3.5 text adds, read from an HF
``qwen3_5_text`` config (``Qwen3_5ForCausalLM``; the text part of the 3.5 checkpoints).

Qwen 3.5 interleaves gated delta-net layers (linear attention over a fixed-size recurrent state
and a short causal convolution, ``layer_types`` ``linear_attention``) with full-attention layers
whose queries carry an output gate and whose rotary embedding covers only the first
``partial_rotary_factor`` of each head. Its rope parameters name an interleaved mRoPE split
(``mrope_section``); for text every position id is the same on all three axes, so the split
changes nothing and the host applies plain rope on the rotary part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.config import (
    AttentionShape,
    DecoderConfig,
    common_fields,
    model_name,
    mtp_modules,
    positive_int,
)
from vllm_tt_host.models.frame.rope_config import read_rope

LINEAR, FULL = "linear_attention", "full_attention"
QWEN3_5_LAYER_TYPES: tuple[str, ...] = (LINEAR, FULL)


@dataclass(frozen=True)
class GatedDeltaShape:
    """One gated delta-net layer: ``num_k_heads`` query/key heads shared by ``num_v_heads``
    value heads, and a depthwise causal convolution of ``conv_kernel`` taps over q, k and v."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """Per request: the last ``conv_kernel - 1`` convolution inputs of every channel."""
        return (self.conv_dim, self.conv_kernel - 1)

    @property
    def recurrent_state_shape(self) -> tuple[int, int, int]:
        """Per request: one ``[k_head_dim, v_head_dim]`` matrix per value head."""
        return (self.num_v_heads, self.k_head_dim, self.v_head_dim)


@dataclass(frozen=True)
class Qwen3_5Config(DecoderConfig):
    layer_kinds: tuple[str, ...] = field(kw_only=True)
    """Per layer: ``linear_attention`` (gated delta-net) or ``full_attention``."""
    delta: GatedDeltaShape = field(kw_only=True)
    rotary_dim: int = field(kw_only=True)
    """Leading dimensions of each head that are rotated (``head_dim * partial_rotary_factor``)."""
    mtp_layers: int = field(default=0, kw_only=True)
    """``mtp_num_hidden_layers``: the MTP module after the last layer (``mtp.*``, one gated
    full-attention layer; ``frame.mtp``, ``method: mtp``); transformers drops its weights."""

    def linear(self, layer: int) -> bool:
        return self.layer_kinds[layer] == LINEAR

    @classmethod
    def read(cls, hf_config: Any, family: str = "qwen3_5", *, n_layers: int | None = None) -> Qwen3_5Config:
        """Read the text config, also when ``hf_config`` is a whole 3.5 checkpoint's (``text_config``)."""
        hf_config = getattr(hf_config, "text_config", None) or hf_config
        model = model_name(hf_config)
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise TTUnsupportedFeatureError(f"{model}: hidden_act", act, "silu", "serve this model with a ttnn mesh")
        shape = AttentionShape.read(hf_config, n_layers=n_layers, head_dim_required=True)
        kinds = tuple(getattr(hf_config, "layer_types", None) or ())
        if len(kinds) < shape.num_layers or any(k not in QWEN3_5_LAYER_TYPES for k in kinds):
            raise TTConfigError(
                f"{model}: layer_types", list(kinds),
                f"{shape.num_layers} entries, each one of {', '.join(QWEN3_5_LAYER_TYPES)}",
                "load the config with transformers >= 5.2 (it fills layer_types in)",
            )
        delta = GatedDeltaShape(
            num_k_heads=positive_int(hf_config, "linear_num_key_heads", model),
            num_v_heads=positive_int(hf_config, "linear_num_value_heads", model),
            k_head_dim=positive_int(hf_config, "linear_key_head_dim", model),
            v_head_dim=positive_int(hf_config, "linear_value_head_dim", model),
            conv_kernel=positive_int(hf_config, "linear_conv_kernel_dim", model),
        )
        if delta.num_v_heads % delta.num_k_heads:
            raise TTConfigError(
                f"{model}: linear_num_value_heads", delta.num_v_heads,
                f"a multiple of linear_num_key_heads={delta.num_k_heads}", "check the checkpoint's config.json",
            )
        rope = read_rope(hf_config, model, ("default",), partial=0.25)
        rotary_dim = int(shape.head_dim * rope.rotary_fraction)
        if not 0 < rotary_dim <= shape.head_dim or rotary_dim % 2:
            raise TTConfigError(
                f"{model}: partial_rotary_factor", rope.rotary_fraction,
                f"a factor giving an even rotary size in 2..{shape.head_dim}", "check the checkpoint's config.json",
            )
        return cls(
            **common_fields(hf_config, shape, family=family, rope=rope, qk_norm=True),
            layer_kinds=kinds[: shape.num_layers],
            delta=delta,
            rotary_dim=rotary_dim,
            mtp_layers=0 if n_layers is not None else mtp_modules(hf_config, model, "mtp_num_hidden_layers"),
        )
