"""GPT-OSS on the host decoder: attention sinks, sliding / full layers, YaRN, routed experts.

What differs from the Llama-style layer, each in its own hook: a learned logit per head
("sink") joins every query's softmax and takes probability mass without contributing a value;
the MLP is a top-k mixture of clamped-SwiGLU experts (``moe``); rotary uses YaRN (``yarn``);
q, k, v and o all carry a bias. Sliding and full layers, and one page table per layer, come
from the shared decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from vllm_tt_host.models.frame.checkpoint import (
    AttentionWeights,
    DecoderWeights,
    LayerWeights,
    WeightFolder,
    check_shapes,
)
from vllm_tt_host.models.frame.decoder import HostDecoder
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM
from vllm_tt_host.models.frame.moe import ExpertWeights, moe_mlp
from vllm_tt_host.models.gpt_oss.config import GptOssConfig


@dataclass(frozen=True)
class GptOssLayer(LayerWeights):
    mlp: ExpertWeights  # type: ignore[assignment]  # the experts take the dense MLP's place
    sinks: torch.Tensor = field(kw_only=True)
    """``[heads]``: each head's sink logit."""


def sink_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Softmax attention ``q [B, H, Tq, d]`` over ``keys/values [B, H, Tk, d]`` (``mask`` True =
    visible, broadcast to ``[B, H, Tq, Tk]``) with one extra logit per head that has no value."""
    scores = (q @ keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    logits = torch.cat((scores, sink), dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    return probs @ values


class GptOssDecoder(HostDecoder):
    @classmethod
    def load(cls, folder: Path, config: GptOssConfig) -> HostDecoder:
        return cls(config, load_gpt_oss_weights(folder, config))

    def __init__(self, config: GptOssConfig, weights: DecoderWeights) -> None:
        super().__init__(config, weights)
        self.moe = config.moe
        self._layers = tuple(_gpt_oss_layer(layer) for layer in weights.layers)

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, index: int
    ) -> torch.Tensor:
        groups = self.config.kv_groups
        return sink_attention(
            q, keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1), mask,
            self._layers[index].sinks, self.config.head_dim**-0.5,
        )

    def _finish_layer(
        self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights, per_layer_input: torch.Tensor | None = None
    ) -> torch.Tensor:
        a = layer.attention
        x = x + F.linear(attn.reshape(x.shape[0], -1), a.o, a.o_bias)
        return x + moe_mlp(self._norm(x, layer.post_attention_norm), _gpt_oss_layer(layer).mlp, self.moe)


class HostGptOssForCausalLM(HybridKVCausalLM):
    """GPT-OSS (``GptOssForCausalLM``), float32 weights, hybrid KV (sliding and full layers);
    ``--data-parallel-size`` folds into in-process lanes, as tt-metal's GPT-OSS does."""

    family: ClassVar[str] = "gpt_oss"
    config_type = GptOssConfig
    decoder_type = GptOssDecoder


def load_gpt_oss_weights(folder: Path, config: GptOssConfig) -> DecoderWeights:
    """Every tensor of ``config`` from ``folder`` as float32, under the names transformers 5
    writes (experts fused per layer: ``mlp.experts.gate_up_proj`` ``[E, hidden, 2I]``)."""
    reader = WeightFolder(folder)
    get = reader.tensor
    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        layers.append(GptOssLayer(
            input_norm=get(p + "input_layernorm.weight"),
            attention=AttentionWeights(
                q=get(attn + "q_proj.weight"), k=get(attn + "k_proj.weight"),
                v=get(attn + "v_proj.weight"), o=get(attn + "o_proj.weight"),
                q_bias=get(attn + "q_proj.bias") if config.qkv_bias else None,
                k_bias=get(attn + "k_proj.bias") if config.qkv_bias else None,
                v_bias=get(attn + "v_proj.bias") if config.qkv_bias else None,
                o_bias=get(attn + "o_proj.bias") if config.o_bias else None,
                q_norm=None, k_norm=None,
            ),
            post_attention_norm=get(p + "post_attention_layernorm.weight"),
            mlp=ExpertWeights(
                router=get(mlp + "router.weight"), router_bias=get(mlp + "router.bias"),
                gate_up=get(mlp + "experts.gate_up_proj"),
                gate_up_bias=get(mlp + "experts.gate_up_proj_bias"),
                down=get(mlp + "experts.down_proj"), down_bias=get(mlp + "experts.down_proj_bias"),
            ),
            sinks=get(attn + "sinks"),
        ))
    embed = get("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else get("lm_head.weight")
    weights = DecoderWeights(
        embed=embed, layers=tuple(layers), norm=get("model.norm.weight"), lm_head=lm_head
    )
    _check_shapes(weights, config, folder)
    return weights


def _gpt_oss_layer(layer: LayerWeights) -> GptOssLayer:
    if not isinstance(layer, GptOssLayer):
        raise TypeError(f"GPT-OSS layers carry experts and sinks; got {type(layer).__name__}")
    return layer


def _check_shapes(weights: DecoderWeights, config: GptOssConfig, folder: Path) -> None:
    layer = _gpt_oss_layer(weights.layers[0])
    e, h, i = config.moe.num_experts, config.hidden_size, config.intermediate_size
    expected = {
        "model.embed_tokens.weight": (weights.embed, (config.vocab_size, h)),
        "self_attn.q_proj.weight": (layer.attention.q, (config.num_heads * config.head_dim, h)),
        "self_attn.k_proj.weight": (layer.attention.k, (config.num_kv_heads * config.head_dim, h)),
        "self_attn.sinks": (layer.sinks, (config.num_heads,)),
        "mlp.router.weight": (layer.mlp.router, (e, h)),
        "mlp.experts.gate_up_proj": (layer.mlp.gate_up, (e, h, 2 * i)),
        "mlp.experts.down_proj": (layer.mlp.down, (e, i, h)),
    }
    check_shapes(expected, folder, note=" (or the experts are saved per expert, which the host GPT-OSS does not read)")
