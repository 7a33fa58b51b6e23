"""``DeepseekV3Config``: the decoder numbers plus what DeepSeek V3 adds (latent attention,
group-limited routed experts with shared experts, the first dense layers, YaRN), read from an
HF ``deepseek_v3`` config.

HF's config sets ``head_dim`` to the rope part of a head; the host reads the MLA sizes
(``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``)
instead. To the KV cache the model is one "head" of ``kv_lora_rank + qk_rope_head_dim`` per
token (the compressed kv and the rotated key), so ``num_kv_heads`` is 1 and ``head_dim`` that
latent width. Routing follows transformers (and vLLM's ``noaux_tc`` with ``sigmoid`` scores);
a checkpoint asking for another routing is refused rather than served wrong.
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

ROPE_TYPES: tuple[str, ...] = ("default", "yarn")
TOPK_METHODS: tuple[str, ...] = ("noaux_tc",)
SCORING_FUNCS: tuple[str, ...] = ("sigmoid",)


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention: queries through an optional low-rank ``q_lora_rank``, keys
    and values from one ``kv_lora_rank`` latent per token plus a shared rotated key."""

    q_lora_rank: int | None
    """None: queries are one full projection (``q_proj``)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool
    """Rotary pairs are adjacent dimensions ``(x0, x1), (x2, x3)...`` (DeepSeek's layout)."""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """What the cache holds per token: the compressed kv, then the rotated key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class RoutedExpertsConfig:
    num_experts: int
    top_k: int
    n_group: int
    """Experts are split in ``n_group`` equal groups; only ``topk_group`` groups may be chosen."""
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    n_shared_experts: int
    moe_intermediate_size: int


@dataclass(frozen=True)
class DeepseekV3Config(DecoderConfig):
    mla: MlaShape = field(kw_only=True)
    experts: RoutedExpertsConfig = field(kw_only=True)
    first_k_dense_replace: int = field(kw_only=True)
    """Layers below this index have a dense MLP, the others routed + shared experts."""
    softmax_scale: float = field(kw_only=True)
    """``qk_head_dim ** -0.5``, times YaRN's ``mscale(factor, mscale_all_dim)`` squared."""
    mtp_layers: int = field(default=0, kw_only=True)
    """``num_nextn_predict_layers``: MTP modules after the last layer (``frame.mtp``, the host
    serves at most one); 0 when only the first layers are kept (``n_layers``)."""

    def dense(self, layer: int) -> bool:
        return layer < self.first_k_dense_replace

    @classmethod
    def read(cls, hf_config: Any, family: str = "deepseek_v3", *, n_layers: int | None = None) -> DeepseekV3Config:
        model = model_name(hf_config)
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise TTUnsupportedFeatureError(f"{model}: hidden_act", act, "silu", "check the checkpoint's config.json")
        shape = AttentionShape.read(hf_config, n_layers=n_layers)
        mla = _mla(hf_config, model)
        experts = _experts(hf_config, model)
        max_positions = int(getattr(hf_config, "max_position_embeddings", 0) or 0)
        rope = read_rope(hf_config, model, ROPE_TYPES, theta=None, max_positions=max_positions)
        scale = mla.qk_head_dim**-0.5 * (rope.yarn.softmax_scale_factor if rope.yarn is not None else 1.0)
        dense = getattr(hf_config, "first_k_dense_replace", 0) or 0
        if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
            raise TTConfigError(f"{model}: first_k_dense_replace", dense, "an int >= 0", "check config.json")
        fields = common_fields(hf_config, shape, family=family, rope=rope, qk_norm=False)
        mtp = mtp_modules(hf_config, model, "num_nextn_predict_layers")
        return cls(
            **fields | {"num_kv_heads": 1, "head_dim": mla.latent_dim},
            mla=mla,
            experts=experts,
            first_k_dense_replace=dense,
            softmax_scale=scale,
            mtp_layers=0 if n_layers is not None else mtp,
        )


def _mla(hf_config: Any, model: str) -> MlaShape:
    q_rank = getattr(hf_config, "q_lora_rank", None)
    if q_rank is not None:
        q_rank = positive_int(hf_config, "q_lora_rank", model)
    rope_dim = positive_int(hf_config, "qk_rope_head_dim", model)
    if rope_dim % 2:
        raise TTConfigError(f"{model}: qk_rope_head_dim", rope_dim, "an even number", "check config.json")
    return MlaShape(
        q_lora_rank=q_rank,
        kv_lora_rank=positive_int(hf_config, "kv_lora_rank", model),
        qk_nope_head_dim=positive_int(hf_config, "qk_nope_head_dim", model),
        qk_rope_head_dim=rope_dim,
        v_head_dim=positive_int(hf_config, "v_head_dim", model),
        rope_interleave=bool(getattr(hf_config, "rope_interleave", True)),
    )


def _experts(hf_config: Any, model: str) -> RoutedExpertsConfig:
    for key, allowed in (("topk_method", TOPK_METHODS), ("scoring_func", SCORING_FUNCS)):
        value = getattr(hf_config, key, None)
        if value is not None and value not in allowed:
            raise TTUnsupportedFeatureError(
                f"{model}: {key}", value, " or ".join(allowed),
                "the host DeepSeek V3 routes as DeepSeek V3 does (noaux_tc, sigmoid scores)",
            )
    num = positive_int(hf_config, "n_routed_experts", model)
    groups = positive_int(hf_config, "n_group", model)
    topk_group = positive_int(hf_config, "topk_group", model)
    top_k = positive_int(hf_config, "num_experts_per_tok", model)
    if num % groups or topk_group > groups:
        raise TTConfigError(
            f"{model}: n_group/topk_group", (groups, topk_group),
            f"n_group dividing n_routed_experts={num}, topk_group <= n_group", "check config.json",
        )
    if num // groups < 2 or top_k > topk_group * (num // groups):
        raise TTConfigError(
            f"{model}: num_experts_per_tok", top_k,
            f"at most topk_group x experts per group = {topk_group * (num // groups)}, with >= 2 experts "
            "per group (a group scores by its two best)", "check config.json",
        )
    return RoutedExpertsConfig(
        num_experts=num,
        top_k=top_k,
        n_group=groups,
        topk_group=topk_group,
        norm_topk_prob=bool(getattr(hf_config, "norm_topk_prob", True)),
        routed_scaling_factor=float(getattr(hf_config, "routed_scaling_factor", 1.0)),
        n_shared_experts=int(getattr(hf_config, "n_shared_experts", 0) or 0),
        moe_intermediate_size=positive_int(hf_config, "moe_intermediate_size", model),
    )
