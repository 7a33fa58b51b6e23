"""Gemma 4 text (``Gemma4ForCausalLM``, HF model type ``gemma4_text``) on the Gemma 3 decoder.

What Gemma 4 changes from Gemma 3, each a hook here: the KV layout is per layer — full-attention
layers have their own head size and KV heads (transformers' ``per_layer_config``, written from
``global_head_dim`` / ``num_global_key_value_heads``), and with ``attention_k_eq_v`` their values
are the key projection (before the key norm and rope); the last ``num_kv_shared_layers`` layers
compute no K or V and attend to the KV of the last earlier layer of their kind (vLLM's
cross-layer KV sharing: they own no blocks). Where a full layer's token costs more values than
a sliding one's, vLLM gives the sliding layers longer blocks so pages agree; each layer reads
its own block size (``frame.hybrid_kv``). Full layers use proportional rope (only
``partial_rotary_factor`` of the head rotates, at frequencies of the whole head). Norms scale by
``w`` (not ``1 + w``), values are RMS-normalised without a weight, attention is unscaled (the
q/k norms set the scale), and each layer's output is multiplied by its ``layer_scalar``.

The E-series (E2B, E4B) add per-layer input embeddings (``hidden_size_per_layer_input``): each
token gets a small vector per layer, half from its own table (scaled by the square root of its
width) and half projected from the token's embedding (then RMS-normalised), and each layer gates
its output with its slice and adds it back through a projection and a norm, before the layer
scalar. Their KV-shared layers may have a double-wide MLP (the checkpoint's shapes carry it).
The mixture-of-experts variant (26B-A4B, ``enable_moe_block``) runs a routed block beside each
layer's dense MLP, both read the same residual: the router RMS-normalises it without a weight,
scales it by its ``scale`` and ``hidden ** -0.5``, softmaxes over all experts, keeps the top-k
renormalised and multiplies each by its ``per_expert_scale``; each expert is a GeGLU (fused
gate/up, gate first) on its own pre-norm of the residual. The dense and routed outputs are each
normalised, summed, and normalised once more as Gemma 3's MLP output is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import (
    AttentionWeights,
    CheckpointError,
    DecoderWeights,
    LayerWeights,
    MlpWeights,
    WeightFolder,
)
from vllm_tt_host.models.frame.config import (
    AttentionShape,
    DecoderConfig,
    common_fields,
    layer_windows,
    model_name,
    positive_int,
    refuse_unimplemented,
)
from vllm_tt_host.models.frame.decoder import HostDecoder
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM
from vllm_tt_host.models.frame.mlp import gelu_tanh
from vllm_tt_host.models.frame.moe import combine_experts
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope_config import read_rope
from vllm_tt_host.models.gemma3.model import (
    ACTIVATIONS,
    Gemma3Config,
    Gemma3Decoder,
    Gemma3LayerWeights,
    HostGemma3ForCausalLM,
    _softcap,
)

GEMMA4_ROPE_TYPES: tuple[str, ...] = ("default", "proportional")

_UNIMPLEMENTED = "host reference models do not implement it; serve this model with a ttnn mesh"
_REFUSED: dict[str, tuple[str, str]] = {
    "attention_bias": ("false", _UNIMPLEMENTED),
}
"""Config fields the host math does not implement: the value it serves, and the fix."""


@dataclass(frozen=True)
class Gemma4Config(Gemma3Config):
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    layer_kv_sources: tuple[int, ...] = ()
    """Per layer, the layer whose KV it attends to (itself unless KV-shared)."""
    values_from_keys: bool = False
    """``attention_k_eq_v``: full layers take their values from the key projection."""
    per_layer_input_size: int = 0
    """``hidden_size_per_layer_input``: each layer's per-layer input width (0: none)."""
    experts: int = 0
    """``num_experts`` of each layer's routed block (0: no ``enable_moe_block``)..."""
    experts_per_token: int = 0
    """...of which ``top_k_experts`` run for each token."""
    images_both_ways: bool = False
    """``use_bidirectional_attention: "vision"``: on the sliding layers the tokens of one image
    attend to each other both ways (the full layers stay causal); text-only prompts are causal."""

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer]

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer]

    def kv_source(self, layer: int) -> int:
        return self.layer_kv_sources[layer]

    def values_are_keys(self, layer: int) -> bool:
        return self.values_from_keys and self.window(layer) is None

    @classmethod
    def read(cls, hf_config: Any, family: str = "gemma4", *, n_layers: int | None = None) -> Gemma4Config:
        """Read a ``Gemma4TextConfig`` (transformers >= 5.17: per-layer shapes in
        ``per_layer_config``; the config refuses to answer ``head_dim`` or
        ``num_key_value_heads`` for the whole model)."""
        model = model_name(hf_config)
        act = getattr(hf_config, "hidden_activation", None) or getattr(hf_config, "hidden_act", None)
        if act not in ACTIVATIONS:
            raise TTUnsupportedFeatureError(
                f"{model}: hidden_activation", act, ", ".join(ACTIVATIONS), "serve this model with a ttnn mesh"
            )
        refuse_unimplemented(hf_config, model, _REFUSED)
        bidirectional = getattr(hf_config, "use_bidirectional_attention", None)
        if bidirectional not in (None, "vision"):
            raise TTUnsupportedFeatureError(f"{model}: use_bidirectional_attention", bidirectional,
                                            'null or "vision" (causal text)', _UNIMPLEMENTED)
        heads = positive_int(hf_config, "num_attention_heads", model)
        layers = positive_int(hf_config, "num_hidden_layers", model)
        if n_layers is not None:
            if not 0 < n_layers <= layers:
                raise TTConfigError("n_layers", n_layers, f"1..{layers}", "pass n_layers=None for the full model")
            layers = n_layers
        windows = layer_windows(hf_config, model, layers)
        kv_heads, head_dims = _layer_shapes(hf_config, model, layers, heads)
        experts, top_k = _experts(hf_config, model)
        global_rope = read_rope(hf_config, model, GEMMA4_ROPE_TYPES, layer_type="full_attention", theta=1_000_000.0,
                                partial=1.0)
        # Layer 0's KV heads and head size; every layer's own in layer_kv_heads, layer_head_dims.
        shape = AttentionShape(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads[0], head_dim=head_dims[0])
        return cls(
            **common_fields(hf_config, shape, family=family, rope=global_rope, qk_norm=True, tie_word_embeddings=True),
            layer_windows=windows,
            local_rope=read_rope(hf_config, model, ("default",), layer_type="sliding_attention"),
            query_pre_attn_scalar=1.0,
            final_logit_softcapping=_softcap(hf_config, "final_logit_softcapping", model),
            layer_head_dims=head_dims,
            layer_kv_heads=kv_heads,
            layer_kv_sources=_kv_sources(hf_config, model, layers),
            values_from_keys=bool(getattr(hf_config, "attention_k_eq_v", False)),
            per_layer_input_size=int(getattr(hf_config, "hidden_size_per_layer_input", 0) or 0),
            experts=experts,
            experts_per_token=top_k,
            images_both_ways=bidirectional == "vision",
        )


def _experts(hf_config: Any, model: str) -> tuple[int, int]:
    """``(experts, experts_per_token)`` of a config with ``enable_moe_block``, else ``(0, 0)``."""
    if not getattr(hf_config, "enable_moe_block", False):
        return 0, 0
    experts = positive_int(hf_config, "num_experts", model)
    top_k = positive_int(hf_config, "top_k_experts", model)
    if top_k > experts:
        raise TTConfigError(f"{model}: top_k_experts", top_k, f"1..num_experts={experts}", "check config.json")
    return experts, top_k


def _layer_shapes(hf_config: Any, model: str, layers: int, heads: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(kv heads, head size)`` of each layer, from transformers' ``per_layer_config``."""
    per_layer = getattr(hf_config, "per_layer_config", None)
    if per_layer is None:
        raise TTConfigError(
            f"{model}: per_layer_config", None, "the per-layer shapes transformers >= 5.17 derives from "
            "global_head_dim", "load the config with transformers >= 5.17",
        )
    kv_heads = tuple(int(per_layer[i].num_key_value_heads) for i in range(layers))
    head_dims = tuple(int(per_layer[i].head_dim) for i in range(layers))
    bad = [i for i in range(layers) if heads % kv_heads[i] or head_dims[i] % 2]
    if bad:
        raise TTConfigError(
            f"{model}: per_layer_config (layers {bad})", [(kv_heads[i], head_dims[i]) for i in bad],
            f"KV heads dividing num_attention_heads={heads} and an even head_dim", "check config.json",
        )
    return kv_heads, head_dims


def _kv_sources(hf_config: Any, model: str, layers: int) -> tuple[int, ...]:
    """Each layer's KV source: from ``num_hidden_layers - num_kv_shared_layers`` on, the last
    earlier layer of the same type (transformers' and vLLM's rule)."""
    types = list(hf_config.layer_types)
    total = len(types)
    shared = int(getattr(hf_config, "num_kv_shared_layers", 0) or 0)
    first = total - shared
    if not 0 <= shared < total:
        raise TTConfigError(
            f"{model}: num_kv_shared_layers", shared, f"0..{total - 1}", "check config.json",
        )
    sources = []
    for layer in range(layers):
        if layer < first:
            sources.append(layer)
            continue
        earlier = [j for j in range(first) if types[j] == types[layer]]
        if not earlier:
            raise TTConfigError(
                f"{model}: num_kv_shared_layers", shared,
                f"a count leaving a {types[layer]} layer before layer {first} for layer {layer} to read",
                "check layer_types and num_kv_shared_layers in config.json",
            )
        sources.append(earlier[-1])
    return tuple(sources)


@dataclass(frozen=True)
class PerLayerInputWeights:
    """One layer's use of its per-layer input."""

    gate: torch.Tensor
    """``[d, hidden]``: the layer output's gate, multiplied by the per-layer input."""
    projection: torch.Tensor
    """``[hidden, d]``: back to the residual stream..."""
    norm: torch.Tensor
    """``[hidden]``: ...through this norm."""


@dataclass(frozen=True)
class PerLayerEmbedding:
    """The model's per-layer input embeddings, every layer's packed in one row per token."""

    table: torch.Tensor
    """``[vocab, layers * d]``: the token's own part."""
    projection: torch.Tensor
    """``[layers * d, hidden]``: the part projected from the token's embedding..."""
    norm: torch.Tensor
    """``[d]``: ...normalised per layer with this."""


@dataclass(frozen=True)
class RoutedExpertWeights:
    """One layer's routed block."""

    router: torch.Tensor
    """``[experts, hidden]``"""
    router_scale: torch.Tensor
    """``[hidden]``: scales the normalised residual before routing."""
    expert_scale: torch.Tensor
    """``[experts]``: scales each chosen expert's renormalised weight."""
    gate_up: torch.Tensor
    """``[experts, 2 * intermediate, hidden]``: gate rows, then up rows."""
    down: torch.Tensor
    """``[experts, hidden, intermediate]``"""
    pre_norm: torch.Tensor
    """``[hidden]``: the experts' own norm of the residual."""
    post_norm: torch.Tensor
    """``[hidden]``: of the experts' sum..."""
    dense_post_norm: torch.Tensor
    """``[hidden]``: ...and of the dense MLP's output, before the two are added."""


@dataclass(frozen=True)
class Gemma4Weights(DecoderWeights):
    per_layer_embedding: PerLayerEmbedding | None
    """``None`` without per-layer inputs."""


@dataclass(frozen=True)
class Gemma4LayerWeights(Gemma3LayerWeights):
    layer_scalar: torch.Tensor
    """``[1]``: the layer's output is scaled by it."""
    per_layer_input: PerLayerInputWeights | None
    experts: RoutedExpertWeights | None


def load_gemma4_weights(folder: Path, config: Gemma4Config, prefix: str = "model.") -> Gemma4Weights:
    """Every tensor ``config`` needs, as float32. A KV-shared layer has no k/v projections or
    k norm (an empty ``k``/``v`` stands for them); a full layer with values from its keys has
    no ``v_proj`` (its ``k_proj`` serves as both)."""
    get = WeightFolder(folder).tensor
    layers = []
    for i in range(config.num_layers):
        p, attn, mlp = f"{prefix}layers.{i}.", f"{prefix}layers.{i}.self_attn.", f"{prefix}layers.{i}.mlp."
        owns_kv = config.kv_source(i) == i
        none = torch.zeros(0, config.hidden_size)
        k = get(attn + "k_proj.weight") if owns_kv else none
        v = none if not owns_kv else k if config.values_are_keys(i) else get(attn + "v_proj.weight")
        q = get(attn + "q_proj.weight")
        want = config.num_heads * config.head_dim_of(i)
        if q.shape[0] != want:
            raise CheckpointError(
                f"{attn}q_proj.weight in {folder} has {q.shape[0]} rows, config.json implies {want}; "
                "the weights and config.json do not belong together"
            )
        layers.append(Gemma4LayerWeights(
            input_norm=get(p + "input_layernorm.weight"),
            attention=AttentionWeights(
                q=q, k=k, v=v, o=get(attn + "o_proj.weight"), q_bias=None, k_bias=None, v_bias=None, o_bias=None,
                q_norm=get(attn + "q_norm.weight"), k_norm=get(attn + "k_norm.weight") if owns_kv else None,
            ),
            post_attention_norm=get(p + "post_attention_layernorm.weight"),
            mlp=MlpWeights(
                gate=get(mlp + "gate_proj.weight"), up=get(mlp + "up_proj.weight"), down=get(mlp + "down_proj.weight"),
                gate_bias=None, up_bias=None, down_bias=None,
            ),
            pre_feedforward_norm=get(p + "pre_feedforward_layernorm.weight"),
            post_feedforward_norm=get(p + "post_feedforward_layernorm.weight"),
            layer_scalar=get(p + "layer_scalar"),
            per_layer_input=PerLayerInputWeights(
                gate=get(p + "per_layer_input_gate.weight"), projection=get(p + "per_layer_projection.weight"),
                norm=get(p + "post_per_layer_input_norm.weight"),
            ) if config.per_layer_input_size else None,
            experts=RoutedExpertWeights(
                router=get(p + "router.proj.weight"), router_scale=get(p + "router.scale"),
                expert_scale=get(p + "router.per_expert_scale"), gate_up=get(p + "experts.gate_up_proj"),
                down=get(p + "experts.down_proj"), pre_norm=get(p + "pre_feedforward_layernorm_2.weight"),
                post_norm=get(p + "post_feedforward_layernorm_2.weight"),
                dense_post_norm=get(p + "post_feedforward_layernorm_1.weight"),
            ) if config.experts else None,
        ))
    embed = get(prefix + "embed_tokens.weight")
    return Gemma4Weights(
        embed=embed, layers=tuple(layers), norm=get(prefix + "norm.weight"),
        lm_head=embed if config.tie_word_embeddings else get("lm_head.weight"),
        per_layer_embedding=_per_layer_embedding(get, config, prefix, folder),
    )


def _per_layer_embedding(get: Any, config: Gemma4Config, prefix: str, folder: Path) -> PerLayerEmbedding | None:
    if not config.per_layer_input_size:
        return None
    table = get(prefix + "embed_tokens_per_layer.weight")
    if table.shape[0] < config.vocab_size or table.shape[1] % config.per_layer_input_size:
        raise CheckpointError(
            f"{prefix}embed_tokens_per_layer.weight in {folder} is {tuple(table.shape)}; config.json implies "
            f"at least {config.vocab_size} rows of layers x {config.per_layer_input_size} "
            "(vocab_size, hidden_size_per_layer_input): the weights and config.json do not belong together"
        )
    return PerLayerEmbedding(
        table=table, projection=get(prefix + "per_layer_model_projection.weight"),
        norm=get(prefix + "per_layer_projection_norm.weight"),
    )


class Gemma4Decoder(Gemma3Decoder):
    config: Gemma4Config
    weights: Gemma4Weights

    @classmethod
    def load(cls, folder: Path, config: Gemma4Config) -> HostDecoder:
        return cls(config, load_gemma4_weights(folder, config))

    def __init__(self, config: Gemma4Config, weights: Gemma4Weights) -> None:
        super().__init__(config, weights)
        if config.per_layer_input_size:  # HF multiplies by these float32 scalars
            self.per_layer_scale = torch.tensor(config.per_layer_input_size**0.5, dtype=torch.float32)

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """``(token part + normalised projection of x) / sqrt(2)``, ``[T, layers, d]``."""
        e, d = self.weights.per_layer_embedding, self.config.per_layer_input_size
        if e is None:
            return None
        own = (e.table[ids] * self.per_layer_scale).view(ids.shape[0], -1, d)
        projected = (F.linear(x, e.projection) * self.config.hidden_size**-0.5).view(x.shape[0], -1, d)
        return (self._norm(projected, e.norm) + own) * 2.0**-0.5

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_norm_eps)

    def _qkv(
        self, h: torch.Tensor, index: int, layer: LayerWeights, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A KV-shared layer returns empty k and v: the decoder writes none for it."""
        a, cfg = layer.attention, self.config
        tokens, dim, rotary = h.shape[0], cfg.head_dim_of(index), self.rotaries[index]
        q = F.linear(h, a.q).view(tokens, cfg.num_heads, dim)
        q = rotary.rotate(self._norm(q, cast(torch.Tensor, a.q_norm)), positions)
        if cfg.kv_source(index) != index:
            empty = h.new_zeros(tokens, 0, dim)
            return q, empty, empty
        heads = cfg.kv_heads_of(index)
        k = F.linear(h, a.k).view(tokens, heads, dim)
        v = k if a.v is a.k else F.linear(h, a.v).view(tokens, heads, dim)
        k = rotary.rotate(self._norm(k, cast(torch.Tensor, a.k_norm)), positions)
        return q, k, rms_norm(v, torch.ones(()), cfg.rms_norm_eps)

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, index: int
    ) -> torch.Tensor:
        groups = self.config.num_heads // self.config.kv_heads_of(index)
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0)

    def _finish_layer(
        self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights, per_layer_input: torch.Tensor | None = None
    ) -> torch.Tensor:
        layer = cast(Gemma4LayerWeights, layer)
        x = super()._finish_layer(x, attn, layer)
        p = layer.per_layer_input
        if p is not None and per_layer_input is not None:
            h = gelu_tanh(F.linear(x, p.gate)) * per_layer_input
            x = x + self._norm(F.linear(h, p.projection), p.norm)
        return x * layer.layer_scalar

    def _feed_forward(self, x: torch.Tensor, layer: Gemma3LayerWeights) -> torch.Tensor:
        dense = super()._feed_forward(x, layer)
        e = cast(Gemma4LayerWeights, layer).experts
        if e is None:
            return dense
        return self._norm(dense, e.dense_post_norm) + self._norm(self._routed(x, e), e.post_norm)

    def _routed(self, x: torch.Tensor, e: RoutedExpertWeights) -> torch.Tensor:
        """The routed block's output for the residual ``x [T, hidden]``."""
        cfg = self.config
        scores = F.linear(rms_norm(x, torch.ones(()), cfg.rms_norm_eps) * e.router_scale * cfg.hidden_size**-0.5,
                          e.router)
        top, chosen = torch.topk(torch.softmax(scores, dim=-1), cfg.experts_per_token, dim=-1)
        weights = top / top.sum(dim=-1, keepdim=True) * e.expert_scale[chosen]

        def expert_mlp(expert: int, h: torch.Tensor) -> torch.Tensor:
            gate, up = F.linear(h, e.gate_up[expert]).chunk(2, dim=-1)
            return F.linear(gelu_tanh(gate) * up, e.down[expert])

        return combine_experts(self._norm(x, e.pre_norm), chosen, weights, expert_mlp)


class HostGemma4ForCausalLM(HostGemma3ForCausalLM):
    """Gemma 4 text: per-layer KV shapes (and block sizes), KV-shared layers, per-layer input
    embeddings (E2B, E4B) and routed experts (26B-A4B), served through hybrid KV."""

    family = "gemma4"
    config_type: ClassVar[type[DecoderConfig]] = Gemma4Config
    decoder_type: ClassVar[type[HostDecoder]] = Gemma4Decoder
    model_capabilities = HybridKVCausalLM.model_capabilities
    """Gemma 3 text's less mixed steps (not proven for Gemma 4's KV-shared layers)."""

