"""Gemma 3 text (``Gemma3ForCausalLM``, HF model type ``gemma3_text``) on the host decoder.

What sets Gemma 3 apart from the Llama-style layers ``HostDecoder`` runs, each a hook here:
sliding-window layers interleaved with global ones (``layer_types``), each kind with its own
rotary base (the local one ``rope_parameters["sliding_attention"]``); RMSNorm scaling by
``1 + w``, also on q and k per head; embeddings scaled by ``sqrt(hidden_size)``; attention
scaled by ``query_pre_attn_scalar ** -0.5`` instead of the head size; a GeGLU MLP (tanh GELU);
norms after attention and around the MLP ("sandwich" norms); and optional tanh soft-capping of
the final logits. ``attn_logit_softcapping`` (a Gemma 2 field) is ignored, as transformers' and
vLLM's Gemma 3 ignore it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import (
    DecoderWeights,
    LayerWeights,
    WeightFolder,
    load_decoder_weights,
)
from vllm_tt_host.models.frame.config import (
    AttentionShape,
    DecoderConfig,
    RopeConfig,
    common_fields,
    layer_windows,
    model_name,
    refuse_unimplemented,
)
from vllm_tt_host.models.frame.decoder import HostDecoder
from vllm_tt_host.models.frame.family import MIXED
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM
from vllm_tt_host.models.frame.mlp import gated_mlp, gelu_tanh
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope_config import read_rope

GEMMA3_ROPE_TYPES: tuple[str, ...] = ("default", "linear")

ACTIVATIONS: tuple[str, ...] = ("gelu_pytorch_tanh",)

_DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
"""transformers' defaults when a config names no base (``Gemma3TextConfig.default_theta``)."""


@dataclass(frozen=True)
class Gemma3Config(DecoderConfig):
    local_rope: RopeConfig = RopeConfig(theta=10_000.0)
    """Rotary parameters of the sliding-window layers (``rope`` is the global layers')."""
    query_pre_attn_scalar: float = 256.0
    final_logit_softcapping: float | None = None

    def rope_of(self, layer: int) -> RopeConfig:
        return self.local_rope if self.window(layer) is not None else self.rope

    @classmethod
    def read(cls, hf_config: Any, family: str = "gemma3", *, n_layers: int | None = None) -> Gemma3Config:
        """Read a ``Gemma3TextConfig`` (or anything with the same attributes)."""
        model = model_name(hf_config)
        act = getattr(hf_config, "hidden_activation", None) or getattr(hf_config, "hidden_act", None)
        if act not in ACTIVATIONS:
            raise TTUnsupportedFeatureError(
                f"{model}: hidden_activation", act, ", ".join(ACTIVATIONS), "serve this model with a ttnn mesh"
            )
        refuse_unimplemented(hf_config, model, {"use_bidirectional_attention": (
            "false (causal attention)", "host reference models serve Gemma 3 as a causal LM; use a causal checkpoint",
        )})
        shape = AttentionShape.read(hf_config, n_layers=n_layers, head_dim_required=True)
        windows = layer_windows(hf_config, model, shape.num_layers)
        global_rope, local_rope = _ropes(hf_config, model)
        return cls(
            **common_fields(hf_config, shape, family=family, rope=global_rope, qk_norm=True, tie_word_embeddings=True),
            layer_windows=windows,
            local_rope=local_rope,
            query_pre_attn_scalar=float(getattr(hf_config, "query_pre_attn_scalar", 256)),
            final_logit_softcapping=_softcap(hf_config, "final_logit_softcapping", model),
        )


def _ropes(hf_config: Any, model: str) -> tuple[RopeConfig, RopeConfig]:
    """``(global, local)``: one rope set per layer type (transformers 5), or the legacy
    ``rope_theta`` + ``rope_scaling`` (global) and ``rope_local_base_freq`` (local)."""
    full, local = (
        read_rope(hf_config, model, GEMMA3_ROPE_TYPES, layer_type=t, theta=_DEFAULT_THETA[t])
        for t in ("full_attention", "sliding_attention")
    )
    return full, local


def _softcap(hf_config: Any, name: str, model: str) -> float | None:
    value = getattr(hf_config, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TTConfigError(f"{model}: {name}", value, "null or a positive number", "check config.json")
    return float(value)


@dataclass(frozen=True)
class Gemma3LayerWeights(LayerWeights):
    pre_feedforward_norm: torch.Tensor
    post_feedforward_norm: torch.Tensor


def load_gemma3_weights(folder: Path, config: Gemma3Config, prefix: str = "model.") -> DecoderWeights:
    """The Llama-shaped tensors plus each layer's two feed-forward norms, under ``prefix``."""
    base = load_decoder_weights(folder, config, prefix)
    reader = WeightFolder(folder)
    layers = tuple(
        Gemma3LayerWeights(
            **{f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)},
            pre_feedforward_norm=reader.tensor(f"{prefix}layers.{i}.pre_feedforward_layernorm.weight"),
            post_feedforward_norm=reader.tensor(f"{prefix}layers.{i}.post_feedforward_layernorm.weight"),
        )
        for i, layer in enumerate(base.layers)
    )
    return dataclasses.replace(base, layers=layers)


class Gemma3Decoder(HostDecoder):
    config: Gemma3Config

    @classmethod
    def load(cls, folder: Path, config: Any) -> HostDecoder:
        """``config`` is a ``Gemma3Config``; Gemma 4 and the vision-language decoder, built
        on this one, load their own."""
        return cls(config, load_gemma3_weights(folder, config))

    def __init__(self, config: Gemma3Config, weights: DecoderWeights) -> None:
        super().__init__(config, weights)
        # HF multiplies by this float32 scalar (not by the Python float).
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weights.embed[ids] * self.embed_scale

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, 1.0 + weight, self.config.rms_norm_eps)

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, index: int
    ) -> torch.Tensor:
        groups = self.config.kv_groups
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        scale = self.config.query_pre_attn_scalar**-0.5
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)

    def _finish_layer(
        self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights, per_layer_input: torch.Tensor | None = None
    ) -> torch.Tensor:
        layer = cast(Gemma3LayerWeights, layer)  # load_gemma3_weights builds only these
        a = layer.attention
        x = x + self._norm(F.linear(attn.reshape(x.shape[0], -1), a.o, a.o_bias), layer.post_attention_norm)
        return x + self._norm(self._feed_forward(x, layer), layer.post_feedforward_norm)

    def _feed_forward(self, x: torch.Tensor, layer: Gemma3LayerWeights) -> torch.Tensor:
        """What the layer adds after attention, before its last norm (Gemma 4: plus experts)."""
        return gated_mlp(self._norm(x, layer.pre_feedforward_norm), layer.mlp, gelu_tanh)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = super()._logits(x)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


class HostGemma3ForCausalLM(HybridKVCausalLM):
    """Gemma 3 text: sliding-window and global layers, served through hybrid KV."""

    family = "gemma3"
    config_type: ClassVar[type[DecoderConfig]] = Gemma3Config
    decoder_type: ClassVar[type[HostDecoder]] = Gemma3Decoder
    model_capabilities: ClassVar[dict[str, Any]] = {**HybridKVCausalLM.model_capabilities, **MIXED}
