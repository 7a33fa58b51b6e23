"""The Gemma 4 audio tower (a USM-style conformer) and its embedder into the text width, in host
torch math.

vLLM's Gemma 4 processor turns a waveform into log-mel frames (``input_features [T, mels]``, the
feature extractor's) and writes one audio token per four frames between the audio markers. The
tower halves the frames twice with 3x3 stride-2 convolutions over (time, mel) (each masked to the
clip's real frames, LayerNorm over channels, ReLU), flattens channels and mel bins and projects
them. Each conformer layer then runs: a half-weighted feed-forward block, local self-attention,
a light convolution block, a second half-weighted feed-forward block and an output norm. The
attention sees a window of keys (fewer than ``attention_context_left - 1`` frames back, itself
included, and fewer than ``attention_context_right`` ahead: transformers' mask) with a learned
per-dimension query scale, a relative position term from sinusoids of each key's distance
(``relative_k_proj``) and a tanh soft cap; the light convolution is a gated linear unit, a
causal depthwise convolution over time, a norm and a projection. Projections clamp their input
and output to stored bounds (``use_clipped_linears``).
``output_proj`` and the embedder (RMS-normalised without a weight, projected) map each frame to
the text width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.config import model_name, positive_int
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.gemma4.vision import CLIP_BOUNDS, Projection

AUDIO_ACTIVATIONS: tuple[str, ...] = ("silu",)
AUDIO_PREFIXES: tuple[str, ...] = ("model.audio_tower.", "audio_tower.")
AUDIO_EMBEDDER_PREFIXES: tuple[str, ...] = ("model.embed_audio.", "embed_audio.")
SUBSAMPLING = 4
"""Input frames per audio token (two stride-2 convolutions)."""


@dataclass(frozen=True)
class Gemma4AudioConfig:
    """The numbers of a ``gemma4_audio`` config the tower needs."""

    hidden_size: int
    num_layers: int
    num_heads: int
    channels: tuple[int, int]
    """``subsampling_conv_channels``; the first is also the feature extractor's mel bins."""
    conv_kernel: int
    residual_weight: float
    chunk: int
    """``attention_chunk_size``: queries per attention block."""
    past: int
    """``attention_context_left - 1``: the frames back a block of keys reaches (the query sees
    fewer), and the distance-table row of a key at distance 0."""
    future: int
    """``attention_context_right``: the frames ahead it reaches (the query sees fewer)."""
    logit_cap: float
    invalid_logit: float
    clipped: bool
    rms_norm_eps: float
    gradient_clipping: float
    output_dims: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def context(self) -> int:
        """Keys of one attention block: its queries and their window."""
        return self.chunk + self.past + self.future

    @classmethod
    def from_hf(cls, hf_audio: Any) -> Gemma4AudioConfig:
        model = model_name(hf_audio)
        act = getattr(hf_audio, "hidden_act", None)
        if act not in AUDIO_ACTIVATIONS:
            raise TTUnsupportedFeatureError(f"{model}: audio_config.hidden_act", act, ", ".join(AUDIO_ACTIVATIONS),
                                            "serve this model with a ttnn mesh")
        hidden, heads = positive_int(hf_audio, "hidden_size", model), positive_int(hf_audio, "num_attention_heads", model)
        channels = tuple(getattr(hf_audio, "subsampling_conv_channels", ()) or ())
        left, right = int(hf_audio.attention_context_left), int(hf_audio.attention_context_right)
        chunk = positive_int(hf_audio, "attention_chunk_size", model)
        if hidden % heads or len(channels) != 2 or left < 1 or right < 0 or chunk > left + right + 1:
            raise TTConfigError(
                f"{model}: audio_config",
                {"hidden_size": hidden, "num_attention_heads": heads, "subsampling_conv_channels": list(channels),
                 "attention_context_left": left, "attention_context_right": right, "attention_chunk_size": chunk},
                "heads dividing hidden_size, two subsampling channel counts, left context >= 1, right >= 0 and a "
                "chunk no longer than the window", "check the checkpoint's config.json")
        return cls(
            hidden_size=hidden, num_layers=positive_int(hf_audio, "num_hidden_layers", model), num_heads=heads,
            channels=(int(channels[0]), int(channels[1])), conv_kernel=positive_int(hf_audio, "conv_kernel_size", model),
            residual_weight=float(hf_audio.residual_weight), chunk=chunk, past=left - 1, future=right,
            logit_cap=float(hf_audio.attention_logit_cap), invalid_logit=float(hf_audio.attention_invalid_logits_value),
            clipped=bool(getattr(hf_audio, "use_clipped_linears", False)),
            rms_norm_eps=float(getattr(hf_audio, "rms_norm_eps", 1e-6)),
            gradient_clipping=float(getattr(hf_audio, "gradient_clipping", 1e10)),
            output_dims=positive_int(hf_audio, "output_proj_dims", model),
        )


@dataclass(frozen=True)
class FeedForwardWeights:
    up: Projection
    down: Projection
    pre_norm: torch.Tensor
    post_norm: torch.Tensor


@dataclass(frozen=True)
class AudioLayerWeights:
    ff1: FeedForwardWeights
    ff2: FeedForwardWeights
    q: Projection
    k: Projection
    v: Projection
    post: Projection
    relative_k: torch.Tensor
    per_dim_scale: torch.Tensor
    norm_pre_attn: torch.Tensor
    norm_post_attn: torch.Tensor
    conv_start: Projection
    conv_end: Projection
    depthwise: torch.Tensor
    """``[hidden, 1, kernel]``: the causal depthwise convolution over time."""
    conv_pre_norm: torch.Tensor
    conv_norm: torch.Tensor
    norm_out: torch.Tensor


@dataclass(frozen=True)
class AudioWeights:
    convs: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    """Each subsampling convolution's ``(weight, LayerNorm weight)``."""
    input_proj: torch.Tensor
    layers: tuple[AudioLayerWeights, ...]
    output_proj: torch.Tensor
    output_bias: torch.Tensor
    embedding: torch.Tensor
    """``[text hidden, output_dims]``: ``embed_audio``'s projection."""


def load_audio_weights(reader: WeightFolder, tower: str, embedder: str, config: Gemma4AudioConfig) -> AudioWeights:
    """The tower's tensors under ``tower`` and the embedder's under ``embedder``."""
    get = reader.tensor

    def projection(name: str) -> Projection:
        bounds = tuple(get(f"{name}.{b}") for b in CLIP_BOUNDS) if config.clipped else None
        return Projection(get(f"{name}.linear.weight"), bounds)  # type: ignore[arg-type]

    def feed_forward(p: str) -> FeedForwardWeights:
        return FeedForwardWeights(projection(f"{p}ffw_layer_1"), projection(f"{p}ffw_layer_2"),
                                  get(f"{p}pre_layer_norm.weight"), get(f"{p}post_layer_norm.weight"))

    layers = tuple(
        AudioLayerWeights(
            ff1=feed_forward(f"{p}feed_forward1."), ff2=feed_forward(f"{p}feed_forward2."),
            q=projection(f"{p}self_attn.q_proj"), k=projection(f"{p}self_attn.k_proj"),
            v=projection(f"{p}self_attn.v_proj"), post=projection(f"{p}self_attn.post"),
            relative_k=get(f"{p}self_attn.relative_k_proj.weight"), per_dim_scale=get(f"{p}self_attn.per_dim_scale"),
            norm_pre_attn=get(f"{p}norm_pre_attn.weight"), norm_post_attn=get(f"{p}norm_post_attn.weight"),
            conv_start=projection(f"{p}lconv1d.linear_start"), conv_end=projection(f"{p}lconv1d.linear_end"),
            depthwise=get(f"{p}lconv1d.depthwise_conv1d.weight"), conv_pre_norm=get(f"{p}lconv1d.pre_layer_norm.weight"),
            conv_norm=get(f"{p}lconv1d.conv_norm.weight"), norm_out=get(f"{p}norm_out.weight"),
        )
        for p in (f"{tower}layers.{i}." for i in range(config.num_layers))
    )
    sub = f"{tower}subsample_conv_projection."
    weights = AudioWeights(
        convs=tuple((get(f"{sub}layer{i}.conv.weight"), get(f"{sub}layer{i}.norm.weight")) for i in (0, 1)),  # type: ignore[arg-type]
        input_proj=get(f"{sub}input_proj_linear.weight"), layers=layers,
        output_proj=get(f"{tower}output_proj.weight"), output_bias=get(f"{tower}output_proj.bias"),
        embedding=get(f"{embedder}embedding_projection.weight"),
    )
    c = config
    check_shapes({
        f"{sub}layer0.conv.weight": (weights.convs[0][0], (c.channels[0], 1, 3, 3)),
        f"{sub}input_proj_linear.weight": (weights.input_proj, (c.hidden_size, c.channels[0] // 4 * c.channels[1])),
        f"{tower}output_proj.weight": (weights.output_proj, (c.output_dims, c.hidden_size)),
        f"{tower}layers.0.lconv1d.depthwise_conv1d.weight": (layers[0].depthwise, (c.hidden_size, 1, c.conv_kernel)),
    }, reader.folder, implied_by="the audio config")
    return weights


class Gemma4AudioTower:
    """One clip's log-mel frames -> its audio token vectors in the text width."""

    def __init__(self, config: Gemma4AudioConfig, weights: AudioWeights) -> None:
        self.config = config
        self.weights = weights
        self.relative = _distance_sinusoids(config)

    def tokens(self, frames: int) -> int:
        """Audio tokens of a clip of ``frames`` real frames."""
        for _ in range(SUBSAMPLING // 2):
            frames = -(-frames // 2)
        return frames

    @torch.no_grad()
    def __call__(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``features [T, mels]`` and ``mask [T]`` (True: a real frame) -> ``[tokens, text hidden]``,
        one per four frames of the real ones."""
        c, w = self.config, self.weights
        if features.dim() != 2 or features.shape[1] != c.channels[0] or mask.shape != features.shape[:1]:
            raise HostModelInputError(
                f"audio input_features {tuple(features.shape)} with mask {tuple(mask.shape)}; expected "
                f"[frames, {c.channels[0]}] (the feature extractor's mel bins) and [frames]")
        x, valid = features.to(torch.float32)[None, None], mask.bool()
        for weight, norm in w.convs:
            x = F.conv2d(x * valid[None, None, :, None], weight, stride=2, padding=1)
            x = F.relu(F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), norm, None, c.rms_norm_eps)).permute(0, 3, 1, 2)
            valid = valid[::2]
        x = F.linear(x[0].permute(1, 2, 0).reshape(x.shape[2], -1), w.input_proj)
        allowed = self._window(valid)
        for layer in w.layers:
            x = self._feed_forward(x, layer.ff1)
            h = self._norm(self._clip(x), layer.norm_pre_attn)
            x = x + self._norm(self._clip(self._attention(h, layer, allowed)), layer.norm_post_attn)
            x = self._light_conv(x, layer)
            x = self._norm(self._clip(self._feed_forward(x, layer.ff2)), layer.norm_out)
        x = F.linear(x[valid], w.output_proj, w.output_bias)
        return F.linear(rms_norm(x, torch.ones(()), c.rms_norm_eps), w.embedding)

    def _window(self, valid: torch.Tensor) -> torch.Tensor:
        """``[T, T]``: query ``t`` sees the real keys fewer than ``past`` frames back (itself
        included) and fewer than ``future`` ahead, as transformers masks them: the window is one
        frame narrower on each side than the blocks of keys it reads from."""
        t = torch.arange(valid.shape[0])
        back = t[:, None] - t[None, :]
        return (((back >= 0) & (back < self.config.past)) | ((back < 0) & (-back < self.config.future))) & valid[None, :]

    def _attention(self, h: torch.Tensor, layer: AudioLayerWeights, allowed: torch.Tensor) -> torch.Tensor:
        """Local attention: content logits plus the query against the key's distance embedding
        (distances the table covers; others add nothing), soft-capped, then masked."""
        c = self.config
        n = h.shape[0]
        shape = (n, c.num_heads, c.head_dim)
        q = layer.q(h).view(shape) * (c.head_dim**-0.5 / math.log(2)) * F.softplus(layer.per_dim_scale)
        k = layer.k(h).view(shape) * (math.log(1 + math.e) / math.log(2))
        v = layer.v(h).view(shape)
        content = torch.einsum("qhd,khd->hqk", q, k)
        relative = F.linear(self.relative, layer.relative_k).view(-1, c.num_heads, c.head_dim)
        by_distance = torch.einsum("qhd,rhd->hqr", q, relative)
        t = torch.arange(n)
        column = c.past - (t[:, None] - t[None, :])  # the table row of each key's distance
        covered = (column >= 0) & (column < relative.shape[0])
        positional = by_distance.gather(2, column.clamp(0, relative.shape[0] - 1)[None].expand(c.num_heads, -1, -1))
        logits = content + positional * covered
        logits = torch.tanh(logits / c.logit_cap) * c.logit_cap
        logits = logits.masked_fill(~allowed, c.invalid_logit)
        out = torch.einsum("hqk,khd->qhd", logits.softmax(-1), v)
        return layer.post(out.reshape(n, -1))

    def _feed_forward(self, x: torch.Tensor, ff: FeedForwardWeights) -> torch.Tensor:
        h = ff.down(F.silu(ff.up(self._norm(self._clip(x), ff.pre_norm))))
        return x + self._norm(self._clip(h), ff.post_norm) * self.config.residual_weight

    def _light_conv(self, x: torch.Tensor, layer: AudioLayerWeights) -> torch.Tensor:
        h = F.glu(layer.conv_start(self._norm(x, layer.conv_pre_norm)), dim=-1)
        h = F.conv1d(F.pad(h.T[None], (self.config.conv_kernel - 1, 0)), layer.depthwise, groups=h.shape[1])[0].T
        return x + layer.conv_end(F.silu(self._norm(self._clip(h), layer.conv_norm)))

    def _clip(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-self.config.gradient_clipping, self.config.gradient_clipping)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_norm_eps)


def _distance_sinusoids(config: Gemma4AudioConfig) -> torch.Tensor:
    """``[context // 2 + 1, hidden]``: row ``e`` the ``[sin, cos]`` embedding of the value
    ``context // 2 - e``; the row of a key ``d`` frames back is ``past - d``."""
    half = config.hidden_size // 2
    step = math.log(10000.0) / max(half - 1, 1)
    inverse = torch.exp(torch.arange(half) * -step)
    values = torch.arange(config.context // 2, -1, -1, dtype=torch.float32)[:, None] * inverse[None, :]
    return torch.cat((torch.sin(values), torch.cos(values)), dim=-1)
