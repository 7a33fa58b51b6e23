"""Mistral 3 (``Mistral3ForConditionalGeneration``) on the host decoder.

The text side is the plain Mistral decoder (causal, 1D rotary positions); the images only
change some input embeddings. Each image runs at its own size through the Pixtral tower
(``pixtral``); its patch states are RMS-normed, every ``spatial_merge_size``-square of patches
is merged into one vector (a learned linear map of their concatenation), and a two-layer MLP
projects those to the text width. In the prompt an image of ``rows x cols`` merged patches is
``rows`` runs of ``cols`` ``[IMG]`` tokens, each run followed by ``[IMG_BREAK]`` except the last,
followed by ``[IMG_END]``; the image vectors replace the ``[IMG]`` embeddings in row-major order,
the break and end tokens keep their own.

vLLM sends each image's ``pixel_values [3, h, w]`` at its processed size (no ``image_sizes``:
the shape is the size), uint8 by default (vLLM's Mistral 3 normalises on the device; the host
model applies the checkpoint's image processor normalisation) or normalised floats with
``--mm-device-do-normalize false``; an image inside the prefix-cache hit comes as None.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from vllm.model_executor.models.mistral3 import Mistral3ForConditionalGeneration as VllmMistral3
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import (
    CheckpointError,
    DecoderWeights,
    WeightFolder,
    load_decoder_weights,
)
from vllm_tt_host.models.frame.config import DecoderConfig, model_name
from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.models.frame.inputs import PrefillRow
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import PixelNorm, computed_pixels, live_images, per_row
from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.mistral3.pixtral import (
    PixtralConfig,
    PixtralVisionTower,
    load_pixtral_weights,
)

LAYOUTS: tuple[tuple[str, str, str, str], ...] = (
    ("language_model.model.", "language_model.lm_head.weight", "vision_tower.", "multi_modal_projector."),
    ("model.language_model.", "lm_head.weight", "model.vision_tower.", "model.multi_modal_projector."),
)
"""(text decoder, lm_head, vision tower, projector) names: as transformers saves Mistral 3
(and the hub checkpoints hold it), and as its modules are named."""
PROJECTOR_ACTIVATIONS: tuple[str, ...] = ("gelu", "silu")
BREAK_TOKEN, END_TOKEN = "[IMG_BREAK]", "[IMG_END]"


@dataclass(frozen=True)
class Mistral3Config(DecoderConfig):
    """The Mistral text decoder's numbers plus the vision side's and the image placeholders'."""

    vision: PixtralConfig = field(kw_only=True)
    feature_layer: int = field(kw_only=True)
    """The tower's output the projector reads: 0 the normed patch embeddings, ``k`` after layer ``k``."""
    spatial_merge_size: int = 2
    projector_activation: str = "gelu"
    projector_bias: bool = False
    image_token_id: int = -1

    @property
    def merged_patch(self) -> int:
        """Pixels per side of one image token."""
        return self.vision.patch_size * self.spatial_merge_size

    @classmethod
    def read(cls, hf_config: Any, family: str = "mistral", *, n_layers: int | None = None) -> Mistral3Config:
        """Read a ``Mistral3Config`` (``text_config`` + ``vision_config``)."""
        model = model_name(hf_config)
        text, vision_config = getattr(hf_config, "text_config", None), getattr(hf_config, "vision_config", None)
        if text is None or vision_config is None:
            raise TTConfigError(f"{model}: text_config/vision_config", None, "both present (model_type mistral3)",
                                "serve a Mistral 3 checkpoint saved by transformers")
        base = DecoderConfig.read(text, family, n_layers=n_layers)
        vision = PixtralConfig.from_hf(vision_config)
        layer = getattr(hf_config, "vision_feature_layer", -1)
        if isinstance(layer, bool) or not isinstance(layer, int) or not -vision.num_layers - 1 <= layer <= vision.num_layers:
            raise TTUnsupportedFeatureError(
                f"{model}: vision_feature_layer", layer, f"one int in -{vision.num_layers + 1}..{vision.num_layers}",
                "serve this model with a ttnn mesh",
            )
        merge = getattr(hf_config, "spatial_merge_size", 2)
        act = getattr(hf_config, "projector_hidden_act", "gelu")
        if act not in PROJECTOR_ACTIVATIONS:
            raise TTUnsupportedFeatureError(f"{model}: projector_hidden_act", act, ", ".join(PROJECTOR_ACTIVATIONS),
                                            "serve this model with a ttnn mesh")
        image_token = getattr(hf_config, "image_token_index", getattr(hf_config, "image_token_id", None))
        if not isinstance(image_token, int) or image_token < 0:
            raise TTConfigError(f"{model}: image_token_index", image_token, "a token id", "check config.json")
        if not isinstance(merge, int) or merge < 1:
            raise TTConfigError(f"{model}: spatial_merge_size", merge, "a positive int", "check config.json")
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields["tie_word_embeddings"] = bool(getattr(hf_config, "tie_word_embeddings", False))
        return cls(
            **fields, vision=vision, feature_layer=layer % (vision.num_layers + 1), spatial_merge_size=merge,
            projector_activation=act, projector_bias=bool(getattr(hf_config, "multimodal_projector_bias", False)),
            image_token_id=image_token,
        )


@dataclass(frozen=True)
class ProjectorWeights:
    norm: torch.Tensor
    merging: torch.Tensor
    """``[vision hidden, vision hidden * merge**2]``: the patch merger (no bias)."""
    linear_1: torch.Tensor
    bias_1: torch.Tensor | None
    linear_2: torch.Tensor
    bias_2: torch.Tensor | None


class Mistral3Projector:
    """One image's patch states ``[rows * cols, vision hidden]`` -> its image token vectors
    ``[rows / merge * cols / merge, text hidden]``, row-major."""

    def __init__(self, config: Mistral3Config, weights: ProjectorWeights) -> None:
        self.config = config
        self.weights = weights

    def __call__(self, states: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        c, w, m = self.config, self.weights, self.config.spatial_merge_size
        x = rms_norm(states, w.norm, c.rms_norm_eps)
        width = x.shape[-1]
        # Each m x m square of patches -> one vector, channel-major (channel, row, column in the square).
        squares = x.view(rows // m, m, cols // m, m, width).permute(0, 2, 4, 1, 3).reshape(-1, width * m * m)
        merged = F.linear(squares, w.merging)
        h = F.linear(merged, w.linear_1, w.bias_1)
        h = F.gelu(h) if c.projector_activation == "gelu" else F.silu(h)
        return F.linear(h, w.linear_2, w.bias_2)


@dataclass(frozen=True)
class PlaceholderIds:
    """The tokens around an image's ``[IMG]`` runs (not in config.json: read from the tokenizer)."""

    image: int
    row_break: int
    end: int

    @classmethod
    def of_checkpoint(cls, folder: Path, image: int) -> PlaceholderIds:
        names = {"image_break_token": BREAK_TOKEN, "image_end_token": END_TOKEN}
        processor = folder / "processor_config.json"
        if processor.is_file():
            saved = json.loads(processor.read_text())
            names.update({k: saved[k] for k in names if isinstance(saved.get(k), str)})
        tokenizer = folder / "tokenizer.json"
        if not tokenizer.is_file():
            raise CheckpointError(f"no tokenizer.json in {folder}: Mistral 3 reads the ids of "
                                  f"{', '.join(names.values())} from it")
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(tokenizer))
        row_break, end = (vocab.token_to_id(names[key]) for key in ("image_break_token", "image_end_token"))
        if row_break is None or end is None:
            raise CheckpointError(f"the tokenizer in {folder} lacks {names['image_break_token']} or "
                                  f"{names['image_end_token']}")
        return cls(image, row_break, end)

    def spans(self, ids: torch.Tensor, row: int) -> list[tuple[int, int]]:
        """``[first, stop)`` of each image's placeholders (its ``[IMG]`` rows through ``[IMG_END]``)."""
        out: list[tuple[int, int]] = []
        first: int | None = None
        for i, token in enumerate(ids.tolist()):
            if token == self.image and first is None:
                first = i
            elif token == self.end and first is not None:
                out.append((first, i + 1))
                first = None
            elif token not in (self.image, self.row_break) and first is not None:
                raise HostModelInputError(f"prefill row {row}: the image placeholders from {first} end at {i} "
                                          f"without {END_TOKEN}")
        if first is not None:
            raise HostModelInputError(
                f"prefill row {row}: the image placeholders from {first} are cut at {ids.shape[0]} (the chunk end "
                "cuts an image: the runner must not split one across prefill chunks)"
            )
        return out


class Mistral3Decoder(HostDecoder):
    config: Mistral3Config

    def __init__(self, config: Mistral3Config, weights: DecoderWeights, tower: PixtralVisionTower,
                 projector: Mistral3Projector, placeholders: PlaceholderIds, pixel_norm: PixelNorm) -> None:
        super().__init__(config, weights)
        self.pixel_norm = pixel_norm
        self.tower = tower
        self.projector = projector
        self.placeholders = placeholders

    @classmethod
    def load(cls, folder: Path, config: Mistral3Config) -> HostDecoder:
        return load_mistral3_decoder(folder, config)

    @torch.no_grad()
    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """One image ``[3, h, w]`` (uint8 or normalised floats) -> its image token vectors
        ``[h * w / merged_patch**2, hidden]``."""
        channels, h, w = pixels.shape
        merged = self.config.merged_patch
        if h % merged or w % merged:
            raise HostModelInputError(f"an image of {h}x{w} pixels: Mistral 3 takes sides that are multiples of "
                                      f"{merged} (patch size x spatial_merge_size), as its processor makes them")
        patch = self.config.vision.patch_size
        normalised = self.pixel_norm.apply(pixels.reshape(1, -1), channels).reshape(pixels.shape)
        return self.projector(self.tower(normalised), h // patch, w // patch)

    def inserts(self, ids: torch.Tensor, start: int, images: list[torch.Tensor | None] | None,
                row: int) -> PrefillInserts | None:
        """Row ``row``'s image vectors for computing ``[start, len(ids))`` of its token history
        ``ids``; ``images`` in prompt order (None: none sent; a None image: inside the
        prefix-cache hit). Only the images the pass computes run the tower."""
        spans = self.placeholders.spans(ids, row)
        live = live_images(spans, start, images, row)
        if not live:
            return None
        index, vectors = [], []
        for k, pixels in zip(live, computed_pixels(live, row, start), strict=True):
            first, stop = spans[k]
            slots = first + (ids[first:stop] == self.placeholders.image).nonzero().flatten()
            features = self.image_features(pixels)
            if features.shape[0] != slots.shape[0]:
                raise HostModelInputError(
                    f"prefill row {row}: image {k} ({tuple(pixels.shape[1:])} pixels) makes {features.shape[0]} "
                    f"image tokens, its placeholders at {first}..{stop} hold {slots.shape[0]}"
                )
            keep = slots >= start
            index.append(slots[keep] - start)
            vectors.append(features[keep])
        return PrefillInserts(torch.cat(index), torch.cat(vectors), torch.full((ids.shape[0],), -1, dtype=torch.long))


def row_images(pixel_values: Any, image_sizes: Any, rows: int) -> list[list[torch.Tensor | None] | None]:
    """The runner's row-aligned ``pixel_values`` (per image ``[3, h, w]``, or a padded
    ``[1, 3, H, W]`` with its ``image_sizes`` entry ``(h, w)``; None: inside the prefix-cache
    hit) -> per row, its images ``[3, h, w]`` in prompt order, or None."""
    out: list[list[torch.Tensor | None] | None] = []
    for row, images in enumerate(per_row(pixel_values, rows, "pixel_values")):
        if not images:
            out.append(None)
            continue
        sizes = image_sizes[row] if isinstance(image_sizes, (list, tuple)) and len(image_sizes) == rows else None
        pictures: list[torch.Tensor | None] = []
        for k, image in enumerate(images):
            if image is None:
                pictures.append(None)
                continue
            t = torch.as_tensor(image)
            t = t[0] if t.dim() == 4 and t.shape[0] == 1 else t
            if sizes is not None and sizes[k] is not None:
                h, w = (int(v) for v in torch.as_tensor(sizes[k]).reshape(-1).tolist())
                t = t[..., :h, :w]
            pictures.append(t)
        out.append(pictures)
    return out


def load_mistral3_decoder(folder: Path, config: Mistral3Config) -> Mistral3Decoder:
    reader = WeightFolder(folder)
    layout = next((names for names in LAYOUTS if names[0] + "embed_tokens.weight" in reader), None)
    if layout is None:
        raise CheckpointError(f"no Mistral 3 text decoder in {folder}: looked for embed_tokens.weight under "
                              f"{', '.join(names[0] for names in LAYOUTS)}")
    text, lm_head, vision, projector = layout
    if not config.tie_word_embeddings and lm_head not in reader:
        lm_head = "lm_head.weight"

    def maybe(name: str) -> torch.Tensor | None:
        return reader.tensor(projector + name) if config.projector_bias else None

    weights = ProjectorWeights(
        norm=reader.tensor(projector + "norm.weight"),
        merging=reader.tensor(projector + "patch_merger.merging_layer.weight"),
        linear_1=reader.tensor(projector + "linear_1.weight"), bias_1=maybe("linear_1.bias"),
        linear_2=reader.tensor(projector + "linear_2.weight"), bias_2=maybe("linear_2.bias"),
    )
    expected = (config.hidden_size, config.vision.hidden_size)
    if tuple(weights.linear_1.shape) != expected:
        raise CheckpointError(f"{projector}linear_1.weight in {folder} has shape {tuple(weights.linear_1.shape)}, "
                              f"config.json implies {expected}")
    tower = PixtralVisionTower(config.vision, load_pixtral_weights(reader, vision, config.vision, config.feature_layer),
                               config.feature_layer)
    return Mistral3Decoder(config, load_decoder_weights(folder, config, text, lm_head), tower,
                           Mistral3Projector(config, weights), PlaceholderIds.of_checkpoint(folder, config.image_token_id),
                           PixelNorm.of_checkpoint(folder))


@vllm_multimodal_processing(VllmMistral3)
class HostMistral3ForConditionalGeneration(HostCausalLM):
    """Mistral 3 with images: prefill rows carry ``pixel_values`` (and maybe ``image_sizes``);
    the rest is the Mistral text decoder."""

    family = "mistral"
    config_type = Mistral3Config
    decoder_type = Mistral3Decoder
    decoder: Mistral3Decoder

    def prefill_inserts(self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any],
                        ) -> list[PrefillInserts | None]:
        images = row_images(kwargs.get("pixel_values"), kwargs.get("image_sizes"), len(rows))
        if self.synthetic is not None:
            return [None] * len(rows)
        return [self.decoder.inserts(tokens[i, : row.end].long(), row.start, images[i], i)
                for i, row in enumerate(rows)]
