"""The Mllama (Llama 3.2 Vision) tiled vision tower and projector in host torch math.

An image arrives as ``max_num_tiles`` tiles (the processor splits it by one of the supported
aspect ratios and pads the unused tiles). Each tile becomes a patch grid plus a class token;
learned embeddings, gated by ``tanh``, add the aspect ratio's tile positions before and after
the local encoder and the patch positions. The local encoder runs over all tiles of an image at
once, keeping some layers' outputs; a gated global encoder follows. The final states and the
kept ones, concatenated, are projected to the text width: those vectors are the keys and values
the text decoder's cross-attention layers read. Padding (unused tiles, the patches that align a
tile to 8) is masked only where a padded query meets a padded key, as transformers masks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.gemma3.siglip import Linear
from vllm_tt_host.models.mllama.config import MllamaVisionConfig

TOWER_NORM_EPS = 1e-5
"""``layernorm_pre`` / ``layernorm_post`` keep LayerNorm's default epsilon (the encoder layers use
``norm_eps``)."""


@dataclass(frozen=True)
class EncoderLayerWeights:
    norm1: Linear
    """LayerNorm weight and bias (a ``Linear`` pair only as storage)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    norm2: Linear
    fc1: Linear
    fc2: Linear
    gate_attn: torch.Tensor | None
    """The global encoder's ``tanh`` gates; None in the local encoder."""
    gate_ffn: torch.Tensor | None


@dataclass(frozen=True)
class TileEmbedding:
    """One learned embedding per aspect ratio, ``tanh(gate)``-gated, over every tile slot."""

    gate: torch.Tensor
    table: torch.Tensor
    """``[max_aspect_ratio_id + 1, max_num_tiles * width]``."""


@dataclass(frozen=True)
class MllamaVisionWeights:
    patch: torch.Tensor
    """The patch convolution ``[hidden, channels, patch, patch]`` (no bias)."""
    class_token: torch.Tensor
    position_gate: torch.Tensor
    positions: torch.Tensor
    """``[patches, hidden]``: the patch positions, weighted ``1 - tanh(position_gate)``."""
    tile_positions: TileEmbedding
    """Per aspect ratio, every tile's patch positions (``max_num_tiles * patches * hidden``)."""
    pre_tile: TileEmbedding
    post_tile: TileEmbedding
    pre_norm: Linear
    post_norm: Linear
    local: tuple[EncoderLayerWeights, ...]
    global_: tuple[EncoderLayerWeights, ...]
    projector: Linear


def load_mllama_vision_weights(reader: WeightFolder, prefix: str, projector: str,
                               config: MllamaVisionConfig) -> MllamaVisionWeights:
    """The tower under ``prefix`` and the projector named ``projector``."""

    def pair(name: str) -> Linear:
        return Linear(reader.tensor(f"{prefix}{name}.weight"), reader.tensor(f"{prefix}{name}.bias"))

    def layers(stack: str, count: int, gated: bool) -> tuple[EncoderLayerWeights, ...]:
        out = []
        for i in range(count):
            p = f"{stack}.layers.{i}."
            attn = f"{prefix}{p}self_attn."
            out.append(EncoderLayerWeights(
                norm1=pair(p + "input_layernorm"), q=reader.tensor(attn + "q_proj.weight"),
                k=reader.tensor(attn + "k_proj.weight"), v=reader.tensor(attn + "v_proj.weight"),
                o=reader.tensor(attn + "o_proj.weight"), norm2=pair(p + "post_attention_layernorm"),
                fc1=pair(p + "mlp.fc1"), fc2=pair(p + "mlp.fc2"),
                gate_attn=reader.tensor(f"{prefix}{p}gate_attn") if gated else None,
                gate_ffn=reader.tensor(f"{prefix}{p}gate_ffn") if gated else None,
            ))
        return tuple(out)

    def tile(name: str, table: str) -> TileEmbedding:
        return TileEmbedding(reader.tensor(f"{prefix}{name}.gate"), reader.tensor(f"{prefix}{name}.{table}.weight"))

    gated = "gated_positional_embedding."
    weights = MllamaVisionWeights(
        patch=reader.tensor(f"{prefix}patch_embedding.weight"),
        class_token=reader.tensor(f"{prefix}class_embedding"),
        position_gate=reader.tensor(f"{prefix}{gated}gate"),
        positions=reader.tensor(f"{prefix}{gated}embedding"),
        tile_positions=tile("gated_positional_embedding", "tile_embedding"),
        pre_tile=tile("pre_tile_positional_embedding", "embedding"),
        post_tile=tile("post_tile_positional_embedding", "embedding"),
        pre_norm=pair("layernorm_pre"), post_norm=pair("layernorm_post"),
        local=layers("transformer", config.num_layers, gated=False),
        global_=layers("global_transformer", config.num_global_layers, gated=True),
        projector=Linear(reader.tensor(projector + "weight"), reader.tensor(projector + "bias")),
    )
    c = config
    ratios = c.max_aspect_ratio_id + 1
    check_shapes({
        f"{prefix}patch_embedding.weight": (weights.patch, (c.hidden_size, c.num_channels, c.patch_size, c.patch_size)),
        f"{prefix}{gated}embedding": (weights.positions, (c.patches, c.hidden_size)),
        f"{prefix}{gated}tile_embedding.weight": (weights.tile_positions.table,
                                                  (ratios, c.max_num_tiles * c.patches * c.hidden_size)),
        f"{prefix}pre_tile_positional_embedding.embedding.weight": (weights.pre_tile.table,
                                                                    (ratios, c.max_num_tiles * c.hidden_size)),
        f"{prefix}transformer.layers.0.mlp.fc1.weight": (weights.local[0].fc1.weight,
                                                         (c.intermediate_size, c.hidden_size)),
        f"{projector}weight": (weights.projector.weight, (weights.projector.weight.shape[0], c.output_dim)),
    }, reader.folder, implied_by="the vision config")
    return weights


class MllamaVisionTower:
    """Images ``[n, tiles, channels, size, size]`` -> their cross-attention states
    ``[n, tiles * patches, text hidden]`` (tile-major, each tile's class token first)."""

    def __init__(self, config: MllamaVisionConfig, weights: MllamaVisionWeights) -> None:
        self.config = config
        self.weights = weights

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, aspect_ratio_ids: torch.Tensor,
                 aspect_ratio_mask: torch.Tensor) -> torch.Tensor:
        c, w = self.config, self.weights
        n, tiles = self._check(pixel_values, aspect_ratio_ids, aspect_ratio_mask)
        grid = F.conv2d(pixel_values.reshape(n * tiles, *pixel_values.shape[2:]).to(torch.float32), w.patch,
                        stride=c.patch_size)
        x = grid.flatten(2).transpose(1, 2).reshape(n, tiles, -1, c.hidden_size)
        ids = aspect_ratio_ids.long()
        x = self._tile(x, w.pre_tile, ids)
        x = torch.cat((w.class_token.expand(n, tiles, 1, c.hidden_size), x), dim=2)
        gate = w.position_gate.tanh()
        x = x + (1 - gate) * w.positions
        x = x + gate * w.tile_positions.table[ids].reshape(n, tiles, c.patches, c.hidden_size)
        x = self._layer_norm(x, w.pre_norm, TOWER_NORM_EPS)
        padded = c.padded_patches
        x = F.pad(x, (0, 0, 0, padded - c.patches))
        allowed = self._allowed(aspect_ratio_mask.bool())
        x = x.reshape(n, tiles * padded, c.hidden_size)
        kept: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(w.local):
            x = self._layer(x, layer, allowed)
            if index in c.intermediate_layers:
                kept[index] = x
        x = self._layer_norm(x, w.post_norm, TOWER_NORM_EPS).reshape(n, tiles, padded, c.hidden_size)
        x = self._tile(x, w.post_tile, ids).reshape(n, tiles * padded, c.hidden_size)
        for layer in w.global_:
            x = self._layer(x, layer, allowed)
        # transformers stacks the kept layers on a last axis, so their features interleave.
        intermediate = torch.stack([kept[i] for i in c.intermediate_layers], dim=-1)
        features = torch.cat((x.reshape(n, tiles, padded, c.hidden_size),
                              intermediate.reshape(n, tiles, padded, -1)), dim=-1)[:, :, : c.patches]
        return w.projector(features).reshape(n, tiles * c.patches, -1)

    def _check(self, pixel_values: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
        c = self.config
        expected = (c.max_num_tiles, c.num_channels, c.image_size, c.image_size)
        if pixel_values.dim() != 5 or tuple(pixel_values.shape[1:]) != expected:
            raise HostModelInputError(f"pixel_values has shape {tuple(pixel_values.shape)}; the Mllama tower takes "
                                      f"[images, {', '.join(map(str, expected))}] (tiles as the processor pads them)")
        n = pixel_values.shape[0]
        if tuple(ids.shape) != (n,) or tuple(mask.shape) != (n, c.max_num_tiles):
            raise HostModelInputError(f"aspect_ratio_ids {tuple(ids.shape)} / aspect_ratio_mask {tuple(mask.shape)} "
                                      f"do not fit {n} images of {c.max_num_tiles} tiles")
        if int(ids.min()) < 0 or int(ids.max()) > c.max_aspect_ratio_id:
            raise HostModelInputError(f"aspect_ratio_ids {ids.tolist()} outside 0..{c.max_aspect_ratio_id}")
        return n, c.max_num_tiles

    def _tile(self, x: torch.Tensor, embedding: TileEmbedding, ids: torch.Tensor) -> torch.Tensor:
        """Add each image's aspect-ratio embedding to every token of each of its tiles."""
        n, tiles, _, width = x.shape
        return x + embedding.gate.tanh() * embedding.table[ids].reshape(n, tiles, 1, width)

    def _allowed(self, tile_mask: torch.Tensor) -> torch.Tensor:
        """``[n, 1, L, L]``: a query/key pair is hidden only when both are padding (an unused
        tile, or a tile's alignment patches)."""
        c = self.config
        pad = (~tile_mask)[:, :, None].expand(-1, -1, c.padded_patches).clone()
        pad[:, :, c.patches:] = True
        pad = pad.reshape(tile_mask.shape[0], -1)
        return ~(pad[:, :, None] & pad[:, None, :])[:, None]

    def _layer(self, x: torch.Tensor, layer: EncoderLayerWeights, allowed: torch.Tensor) -> torch.Tensor:
        c = self.config
        n, tokens, _ = x.shape
        h = self._layer_norm(x, layer.norm1, c.norm_eps)

        def heads(weight: torch.Tensor) -> torch.Tensor:
            return F.linear(h, weight).view(n, tokens, c.num_heads, c.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(layer.q), heads(layer.k), heads(layer.v), attn_mask=allowed,
                                             scale=c.head_dim**-0.5)
        attn = F.linear(out.transpose(1, 2).reshape(n, tokens, c.hidden_size), layer.o)
        x = x + (attn if layer.gate_attn is None else layer.gate_attn.tanh() * attn)
        mlp = layer.fc2(F.gelu(layer.fc1(self._layer_norm(x, layer.norm2, c.norm_eps))))
        return x + (mlp if layer.gate_ffn is None else layer.gate_ffn.tanh() * mlp)

    def _layer_norm(self, x: torch.Tensor, norm: Linear, eps: float) -> torch.Tensor:
        return F.layer_norm(x, (self.config.hidden_size,), norm.weight, norm.bias, eps)
