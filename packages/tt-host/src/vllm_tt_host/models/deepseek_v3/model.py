"""DeepSeek V3 on the host decoder: multi-head latent attention (MLA) over a latent KV cache,
routed + shared experts after the first dense layers, YaRN.

MLA caches one vector per token and layer: the compressed kv (``kv_lora_rank``, RMS-normed)
followed by the rotated key part shared by every head (``qk_rope_head_dim``). That is what the
paged cache holds (one "head" of ``kv_lora_rank + qk_rope_head_dim``; vLLM's
``MLAAttentionSpec``); attention expands the cached latents into per-head keys and values
through ``kv_b_proj`` as transformers does. Each head's query is split the same way: its first
``qk_nope_head_dim`` meet the expanded keys, its last ``qk_rope_head_dim`` are rotated (with
DeepSeek's interleaved pairs) and meet the shared rotated key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from vllm_tt_host.models.deepseek_v3.config import DeepseekV3Config
from vllm_tt_host.models.deepseek_v3.moe import RoutedExperts, routed_moe
from vllm_tt_host.models.frame.checkpoint import (
    DecoderWeights,
    LayerWeights,
    MlpWeights,
    WeightFolder,
    check_shapes,
)
from vllm_tt_host.models.frame.decoder import HostDecoder
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM, layer_name
from vllm_tt_host.models.frame.mlp import gated_mlp
from vllm_tt_host.models.frame.mtp import MtpModule
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope import RotaryEmbedding

LATENT_NORM_EPS = 1e-6
"""transformers' ``q_a_layernorm`` / ``kv_a_layernorm`` keep their default epsilon."""


@dataclass(frozen=True)
class QueryLora:
    """Queries through a rank-``q_lora_rank`` bottleneck: ``q_a_proj``, RMSNorm, ``q_b_proj``."""

    down: torch.Tensor
    norm: torch.Tensor
    up: torch.Tensor
    """``[heads * qk_head_dim, q_lora_rank]``."""
    down_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class MlaWeights:
    q: torch.Tensor | QueryLora
    """``q_proj`` ``[heads * qk_head_dim, hidden]``, or the q LoRA."""
    kv_a: torch.Tensor
    """``kv_a_proj_with_mqa`` ``[kv_lora_rank + qk_rope_head_dim, hidden]``."""
    kv_a_norm: torch.Tensor
    kv_b: torch.Tensor
    """``[heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]``."""
    o: torch.Tensor
    kv_a_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class DeepseekV3Layer(LayerWeights):
    attention: MlaWeights  # type: ignore[assignment]  # latent attention's projections
    mlp: MlpWeights | RoutedExperts  # type: ignore[assignment]  # dense or routed + shared
    index: int = field(kw_only=True)


class DeepseekV3Decoder(HostDecoder):
    """The shared paged decoder with MLA projections and attention and DeepSeek's MLPs."""

    @classmethod
    def load(cls, folder: Path, config: DeepseekV3Config) -> HostDecoder:
        return cls(config, load_deepseek_v3_weights(folder, config))

    def __init__(self, config: DeepseekV3Config, weights: DecoderWeights) -> None:
        super().__init__(config, weights)
        self.ds = config
        rope_dim = config.mla.qk_rope_head_dim
        rotary = RotaryEmbedding.of(config.rope, rope_dim)
        self._layers = tuple(_deepseek_layer(layer) for layer in weights.layers)
        self.mtp = mtp if isinstance(weights, DeepseekV3Weights) and (mtp := weights.mtp) is not None else None
        if self.mtp is not None:  # the MTP block is layer num_hidden_layers of the same math
            self._layers += (_deepseek_layer(self.mtp.block),)
        self.rotaries = tuple(rotary for _ in self._layers)

    def _rope(self, x: torch.Tensor, index: int, positions: torch.Tensor) -> torch.Tensor:
        """Rotate the rope part ``[T, heads, rope_dim]``; interleaved pairs are first gathered
        into two halves (the dot products are unchanged, queries and keys alike)."""
        if self.ds.mla.rope_interleave:
            x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
        return self.rotaries[index].rotate(x, positions)

    def _qkv(
        self, h: torch.Tensor, index: int, layer: LayerWeights, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[T, heads, qk_head_dim]`` (rope part rotated) and the latent to cache
        ``[T, 1, kv_lora_rank + rope_dim]``, returned as both key and value: MLA's cache has one
        tensor, which ``allocate_kv_cache_per_layer`` hands out as K and V alike."""
        a = self._layers[index].attention
        mla = self.ds.mla
        tokens = h.shape[0]
        if isinstance(a.q, QueryLora):
            q = F.linear(rms_norm(F.linear(h, a.q.down, a.q.down_bias), a.q.norm, LATENT_NORM_EPS), a.q.up)
        else:
            q = F.linear(h, a.q)
        q = q.view(tokens, self.config.num_heads, mla.qk_head_dim)
        q_rope = self._rope(q[..., mla.qk_nope_head_dim :], index, positions)
        q = torch.cat((q[..., : mla.qk_nope_head_dim], q_rope), dim=-1)
        kv = F.linear(h, a.kv_a, a.kv_a_bias)
        latent = rms_norm(kv[:, : mla.kv_lora_rank], a.kv_a_norm, LATENT_NORM_EPS)
        k_rope = self._rope(kv[:, None, mla.kv_lora_rank :], index, positions)
        cached = torch.cat((latent[:, None, :], k_rope), dim=-1)
        return q, cached, cached

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, index: int
    ) -> torch.Tensor:
        """``q [B, heads, Tq, qk_head_dim]`` over the cached latents ``keys [B, 1, Tk, latent]``
        (``values`` is the same cache): each head's keys and values come from ``kv_b_proj``."""
        mla = self.ds.mla
        a = self._layers[index].attention
        batch, _, length, _ = keys.shape
        latent, k_rope = keys[:, 0, :, : mla.kv_lora_rank], keys[:, :, :, mla.kv_lora_rank :]
        expanded = F.linear(latent, a.kv_b).view(batch, length, self.config.num_heads, -1).transpose(1, 2)
        k_nope, v = expanded.split((mla.qk_nope_head_dim, mla.v_head_dim), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, self.config.num_heads, -1, -1)), dim=-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.ds.softmax_scale)

    def _finish_layer(
        self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights, per_layer_input: torch.Tensor | None = None
    ) -> torch.Tensor:
        a = _deepseek_layer(layer).attention
        x = x + F.linear(attn.reshape(x.shape[0], -1), a.o, a.o_bias)
        h = self._norm(x, layer.post_attention_norm)
        mlp = _deepseek_layer(layer).mlp
        return x + (routed_moe(h, mlp, self.ds.experts) if isinstance(mlp, RoutedExperts) else gated_mlp(h, mlp))


class HostDeepseekV3ForCausalLM(HybridKVCausalLM):
    """DeepSeek V3 (``DeepseekV3ForCausalLM``), float32 weights, latent attention (one MLA KV
    group); ``--data-parallel-size`` folds into in-process lanes, as tt-metal's DeepSeek V3
    (whose data-parallel factor is the mesh size) requires."""

    family: ClassVar[str] = "deepseek_v3"
    model_capabilities: ClassVar[dict[str, Any]] = {
        **HybridKVCausalLM.model_capabilities, "kv_cache_kinds": ["mla"], "single_program_lanes": True,
        "supports_mtp": True,
    }
    config_type = DeepseekV3Config
    decoder_type = DeepseekV3Decoder

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any]:
        """One ``MLAAttentionSpec`` per layer: one latent of ``kv_lora_rank + qk_rope_head_dim``
        per token (one head, no separate V)."""
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        config = cls.decoder_config(vllm_config.model_config.hf_config)
        spec = MLAAttentionSpec(
            block_size=vllm_config.cache_config.block_size, num_kv_heads=1, head_size=config.head_dim,
            dtype=vllm_config.model_config.dtype,
        )
        return {layer_name(layer): spec for layer in range(config.num_layers)}

    @staticmethod
    def layer_storage(shape: tuple[int, int, int, int]) -> list[torch.Tensor]:
        latent = torch.zeros(shape)
        return [latent, latent]


@dataclass(frozen=True)
class DeepseekV3Weights(DecoderWeights):
    mtp: MtpModule | None = field(default=None, kw_only=True)


def load_deepseek_v3_weights(folder: Path, config: DeepseekV3Config) -> DecoderWeights:
    """Every tensor of ``config`` from ``folder`` as float32, under the names transformers
    writes (routed experts saved one by one: ``mlp.experts.{e}.gate_proj``), and the MTP
    module's under vLLM's ``deepseek_mtp`` names when ``num_nextn_predict_layers`` is set."""
    weights = WeightFolder(folder)
    get = weights.tensor
    layers = tuple(_load_layer(get, config, i) for i in range(config.num_layers))
    embed = get("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else get("lm_head.weight")
    mtp = _load_mtp(weights, config, embed) if config.mtp_layers else None
    loaded = DeepseekV3Weights(embed=embed, layers=layers, norm=get("model.norm.weight"), lm_head=lm_head, mtp=mtp)
    _check_shapes(loaded, config, folder)
    return loaded


def _load_mtp(weights: WeightFolder, config: DeepseekV3Config, embed: torch.Tensor) -> MtpModule | None:
    """Module ``model.layers.{num_hidden_layers}``: ``enorm``, ``hnorm``, ``eh_proj``,
    ``shared_head.{norm,head}``, an optional own ``embed_tokens`` and a decoder block; None
    when the checkpoint ships no MTP weights (``method: mtp`` is then refused at startup)."""
    index = config.num_layers
    p = f"model.layers.{index}."
    if p + "eh_proj.weight" not in weights:
        return None
    get = weights.tensor
    return MtpModule(
        index=index, embed=get(p + "embed_tokens.weight") if p + "embed_tokens.weight" in weights else embed,
        enorm=get(p + "enorm.weight"), hnorm=get(p + "hnorm.weight"), eh_proj=get(p + "eh_proj.weight"),
        block=_load_layer(get, config, index), norm=get(p + "shared_head.norm.weight"),
        head=get(p + "shared_head.head.weight"),
    )


def _load_layer(get: Any, config: DeepseekV3Config, i: int) -> DeepseekV3Layer:
    """Layer ``i``'s weights (the MTP block is layer ``num_hidden_layers``)."""
    bias = config.qkv_bias
    p = f"model.layers.{i}."
    attn, mlp = p + "self_attn.", p + "mlp."
    lora = config.mla.q_lora_rank is not None
    attention = MlaWeights(
        q=QueryLora(
            down=get(attn + "q_a_proj.weight"), norm=get(attn + "q_a_layernorm.weight"),
            up=get(attn + "q_b_proj.weight"), down_bias=get(attn + "q_a_proj.bias") if bias else None,
        ) if lora else get(attn + "q_proj.weight"),
        kv_a=get(attn + "kv_a_proj_with_mqa.weight"),
        kv_a_norm=get(attn + "kv_a_layernorm.weight"),
        kv_b=get(attn + "kv_b_proj.weight"),
        o=get(attn + "o_proj.weight"),
        kv_a_bias=get(attn + "kv_a_proj_with_mqa.bias") if bias else None,
        o_bias=get(attn + "o_proj.bias") if config.o_bias else None,
    )
    return DeepseekV3Layer(
        input_norm=get(p + "input_layernorm.weight"),
        attention=attention,
        post_attention_norm=get(p + "post_attention_layernorm.weight"),
        mlp=_dense(get, mlp) if config.dense(i) else RoutedExperts(
            router=get(mlp + "gate.weight"),
            correction_bias=get(mlp + "gate.e_score_correction_bias"),
            experts=tuple(_dense(get, f"{mlp}experts.{e}.") for e in range(config.experts.num_experts)),
            shared=_dense(get, mlp + "shared_experts.") if config.experts.n_shared_experts else None,
        ),
        index=i,
    )


def _dense(get: Any, prefix: str) -> MlpWeights:
    return MlpWeights(
        gate=get(prefix + "gate_proj.weight"), up=get(prefix + "up_proj.weight"),
        down=get(prefix + "down_proj.weight"), gate_bias=None, up_bias=None, down_bias=None,
    )


def _deepseek_layer(layer: LayerWeights) -> DeepseekV3Layer:
    if not isinstance(layer, DeepseekV3Layer):
        raise TypeError(f"DeepSeek V3 layers carry MLA weights; got {type(layer).__name__}")
    return layer


def _check_shapes(weights: DecoderWeights, config: DeepseekV3Config, folder: Path) -> None:
    mla, h, heads = config.mla, config.hidden_size, config.num_heads
    expected: dict[str, tuple[torch.Tensor, tuple[int, ...]]] = {
        "model.embed_tokens.weight": (weights.embed, (config.vocab_size, h)),
    }
    for layer in (_deepseek_layer(layer) for layer in weights.layers):
        a, p = layer.attention, f"layers.{layer.index}."
        expected[p + "kv_a_proj_with_mqa.weight"] = (a.kv_a, (mla.latent_dim, h))
        expected[p + "kv_b_proj.weight"] = (a.kv_b, (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank))
        expected[p + "o_proj.weight"] = (a.o, (h, heads * mla.v_head_dim))
        q_width = heads * mla.qk_head_dim
        lora = isinstance(a.q, QueryLora)
        expected[p + ("q_b_proj.weight" if lora else "q_proj.weight")] = (
            a.q.up if isinstance(a.q, QueryLora) else a.q, (q_width, mla.q_lora_rank or h),
        )
        if isinstance(layer.mlp, RoutedExperts):
            e = config.experts
            expected[p + "mlp.gate.weight"] = (layer.mlp.router, (e.num_experts, h))
            expected[p + "mlp.experts.0.up_proj.weight"] = (layer.mlp.experts[0].up, (e.moe_intermediate_size, h))
        else:
            expected[p + "mlp.up_proj.weight"] = (layer.mlp.up, (config.intermediate_size, h))
    check_shapes(expected, folder)
