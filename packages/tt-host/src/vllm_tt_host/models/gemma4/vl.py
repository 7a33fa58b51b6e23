"""Gemma 4 vision-language (``Gemma4ForConditionalGeneration``) on the host Gemma 4 decoder.

The text side is Gemma 4 text (``gemma4``: hybrid KV, KV-shared layers, per-layer input
embeddings); what the images add happens only in prefill. Each image runs through the Gemma 4
vision tower (``vision``) at its own patch grid and becomes as many vectors as the processor
wrote image tokens for it (between its begin and end markers); they replace those tokens'
embeddings (unscaled). Every image, video or audio placeholder token embeds, and looks up its
per-layer input, as the pad token, as transformers does; the per-layer inputs' projected half
reads the image vectors. With ``use_bidirectional_attention: "vision"`` the tokens of one image
attend to each other both ways on the sliding layers only (the full layers stay causal);
without it every layer is causal. Decode is the text model's.

vLLM sends each image as its processor made it: ``pixel_values [patches, 3 * P * P]`` (floats
in ``[0, 1]``, padded to the patch budget) and ``pixel_position_ids [patches, 2]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration as VllmGemma4
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import CheckpointError, WeightFolder
from vllm_tt_host.models.frame.config import model_name
from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.inputs import PrefillRow
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import (
    computed_pixels,
    image_runs,
    live_images,
    per_row,
    text_and_vision,
)
from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.gemma4.embedder import Gemma4UnifiedEmbedder, UnifiedVisionConfig
from vllm_tt_host.models.gemma4.model import (
    Gemma4Config,
    Gemma4Decoder,
    HostGemma4ForCausalLM,
    load_gemma4_weights,
)
from vllm_tt_host.models.gemma4.vision import Gemma4VisionConfig, Gemma4VisionTower, load_vision_weights

TEXT_PREFIXES: tuple[str, ...] = ("model.language_model.", "language_model.model.")
"""Where checkpoints keep the text decoder (transformers 5 writes the first)."""
VISION_PREFIXES: tuple[str, ...] = ("model.vision_tower.", "vision_tower.")
EMBEDDER_PREFIXES: tuple[str, ...] = ("model.embed_vision.", "embed_vision.")
PLACEHOLDER_IDS: tuple[str, ...] = ("image_token_id", "video_token_id", "audio_token_id")
"""The multimodal placeholder tokens transformers embeds as the pad token."""


@dataclass(frozen=True)
class Gemma4VLConfig(Gemma4Config):
    """The text decoder's numbers plus the vision tower's and the placeholder tokens'."""

    vision: Gemma4VisionConfig | UnifiedVisionConfig = field(kw_only=True)
    """The vision tower's (Gemma 4 Unified: the encoder-free embedder's)."""
    image_token_id: int = field(kw_only=True)
    placeholder_ids: tuple[int, ...] = field(kw_only=True)
    """Every placeholder token (image, video, audio) of the checkpoint..."""
    pad_token_id: int = field(kw_only=True)
    """...embedded as this one."""

    @classmethod
    def read(cls, hf_config: Any, family: str = "gemma4", *, n_layers: int | None = None) -> Gemma4VLConfig:
        """Read a ``Gemma4Config`` (``text_config`` + ``vision_config``; an ``audio_config`` is
        left unread: the host model takes images only)."""
        model = model_name(hf_config)
        text_config, vision_config = text_and_vision(
            hf_config, "serve a Gemma 4 vision-language checkpoint, or a text one as Gemma4ForCausalLM",
        )
        text = Gemma4Config.read(text_config, family, n_layers=n_layers)
        ids = {name: _token_id(hf_config, name, model) for name in PLACEHOLDER_IDS}
        pad = _token_id(text_config, "pad_token_id", model)
        if pad >= text.vocab_size:
            raise TTConfigError(f"{model}: text_config.pad_token_id", pad, f"below vocab_size={text.vocab_size}",
                                "check the checkpoint's config.json")
        fields = {f.name: getattr(text, f.name) for f in dataclasses.fields(text)}
        return cls(**fields, vision=cls.read_vision(vision_config), image_token_id=ids["image_token_id"],
                   placeholder_ids=tuple(ids.values()), pad_token_id=pad)

    @staticmethod
    def read_vision(hf_vision: Any) -> Gemma4VisionConfig | UnifiedVisionConfig:
        return Gemma4VisionConfig.from_hf(hf_vision)


def _token_id(hf_config: Any, name: str, model: str) -> int:
    value = getattr(hf_config, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TTConfigError(f"{model}: {name}", value, "a token id", "check the checkpoint's config.json")
    return value


@dataclass(frozen=True)
class PatchedImage:
    """One image as the Gemma 4 processor cut it."""

    pixels: torch.Tensor
    """``[patches, 3 * P * P]``"""
    positions: torch.Tensor
    """``[patches, 2]``: each patch's ``(x, y)``; padding at ``(-1, -1)``."""


class Gemma4VLDecoder(Gemma4Decoder):
    config: Gemma4VLConfig

    def __init__(self, config: Gemma4VLConfig, weights: Any, tower: Gemma4VisionTower | Gemma4UnifiedEmbedder) -> None:
        super().__init__(config, weights)
        self.tower = tower
        self.placeholders = torch.tensor(config.placeholder_ids)

    @classmethod
    def load(cls, folder: Path, config: Any) -> HostDecoder:
        """The text decoder, tower and embedder (``config``: a ``Gemma4VLConfig``), under the
        names transformers 5 (or 4) wrote."""
        reader = WeightFolder(folder)
        text = reader.prefix(TEXT_PREFIXES, "embed_tokens.weight", "text decoder")
        return cls(config, load_gemma4_weights(folder, config, text), cls.load_encoder(reader, config))

    @staticmethod
    def load_encoder(reader: WeightFolder, config: Gemma4VLConfig) -> Gemma4VisionTower | Gemma4UnifiedEmbedder:
        """The image encoder: the vision tower and its embedder into the text width."""
        vision = cast(Gemma4VisionConfig, config.vision)  # what read_vision makes
        tower = reader.prefix(VISION_PREFIXES, "patch_embedder.input_proj.weight", "vision tower")
        embedder = reader.prefix(EMBEDDER_PREFIXES, "embedding_projection.weight", "vision embedder")
        weights = load_vision_weights(reader, tower, embedder, vision)
        expected = (config.hidden_size, vision.hidden_size)
        if tuple(weights.embedding.shape) != expected:
            raise CheckpointError(f"{embedder}embedding_projection.weight in {reader.folder} has shape "
                                  f"{tuple(weights.embedding.shape)}, config.json implies {expected}")
        return Gemma4VisionTower(vision, weights)

    def _as_text(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` with every placeholder token replaced by the pad token."""
        return torch.where(torch.isin(ids, self.placeholders), self.config.pad_token_id, ids)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return super()._embed(self._as_text(ids))

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        return super()._per_layer_inputs(self._as_text(ids), x)

    def _image_blocks(self, index: int, inserts: PrefillInserts | None) -> torch.Tensor | None:
        both_ways = self.config.images_both_ways and self.config.window(index) is not None
        return super()._image_blocks(index, inserts) if both_ways else None

    def inserts(self, ids: torch.Tensor, start: int, images: list[PatchedImage | None] | None,
                row: int) -> PrefillInserts | None:
        """Row ``row``'s image vectors for computing ``[start, len(ids))`` of its token history
        ``ids``; ``images`` in prompt order (None: none sent; a None image: inside the
        prefix-cache hit). Only the images the pass computes run the tower."""
        runs = image_runs(ids, self.config.image_token_id)
        if runs and runs[-1][1] == ids.shape[0]:
            raise HostModelInputError(
                f"prefill row {row}: the image placeholders from {runs[-1][0]} reach the chunk end {ids.shape[0]} "
                "without their end marker (the chunk end cuts an image: the runner must not split one across "
                "prefill chunks)"
            )
        live = live_images(runs, start, images, row)
        if not live:
            return None
        blocks = torch.full((ids.shape[0],), -1, dtype=torch.long)
        index, vectors = [], []
        for k, image in zip(live, computed_pixels(live, row, start), strict=True):
            first, stop = runs[k]
            features = self.tower(image.pixels, image.positions)
            if features.shape[0] != stop - first:
                raise HostModelInputError(
                    f"prefill row {row}: image {k} ({image.pixels.shape[0]} patches) makes {features.shape[0]} image "
                    f"tokens, its placeholder run at {first}..{stop} holds {stop - first}"
                )
            blocks[first:stop] = k
            lo = max(first, start)
            index.append(torch.arange(lo, stop) - start)
            vectors.append(features[lo - first :])
        return PrefillInserts(torch.cat(index), torch.cat(vectors), blocks)


def row_images(pixel_values: Any, positions: Any, rows: int) -> list[list[PatchedImage | None] | None]:
    """The runner's row-aligned ``pixel_values`` and ``pixel_position_ids`` (per image
    ``[patches, 3 * P * P]`` and ``[patches, 2]``, or with a leading 1; None: inside the
    prefix-cache hit) -> per row, its images in prompt order, or None."""
    out: list[list[PatchedImage | None] | None] = []
    for row, (pixels, xy) in enumerate(zip(per_row(pixel_values, rows, "pixel_values"),
                                           per_row(positions, rows, "pixel_position_ids"), strict=True)):
        if not pixels:
            out.append(None)
            continue
        if xy is None or len(xy) != len(pixels):
            raise HostModelInputError(f"prefill row {row}: pixel_position_ids must come with pixel_values, one "
                                      "per image (Gemma 4's processor writes both)")
        images: list[PatchedImage | None] = []
        for k, (p, q) in enumerate(zip(pixels, xy, strict=True)):
            if p is None:
                images.append(None)
                continue
            p, q = (torch.as_tensor(t) for t in (p, q))
            p, q = (t[0] if t.dim() == 3 and t.shape[0] == 1 else t for t in (p, q))
            if p.dtype == torch.uint8:
                raise HostModelInputError(f"pixel_values of row {row} are uint8; Gemma 4 takes the image "
                                          "processor's rescaled floats (serve with --mm-device-do-normalize false)")
            if p.dim() != 2 or q.shape != (p.shape[0], 2):
                raise HostModelInputError(
                    f"prefill row {row} image {k}: pixel_values {tuple(p.shape)} and pixel_position_ids "
                    f"{tuple(q.shape)}; expected [patches, 3 * P * P] and [patches, 2]"
                )
            images.append(PatchedImage(p, q))
        out.append(images)
    return out


@vllm_multimodal_processing(VllmGemma4)
class HostGemma4ForConditionalGeneration(HostGemma4ForCausalLM):
    """Gemma 4 with images: prefill rows carry ``pixel_values`` and ``pixel_position_ids``;
    the rest is Gemma 4 text."""

    family = "gemma4"
    config_type = Gemma4VLConfig
    decoder_type = Gemma4VLDecoder
    decoder: Gemma4VLDecoder

    def prefill_inserts(self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any],
                        ) -> list[PrefillInserts | None]:
        images = row_images(kwargs.get("pixel_values"), kwargs.get("pixel_position_ids"), len(rows))
        if self.synthetic is not None:
            return [None] * len(rows)
        return [self.decoder.inserts(tokens[i, : row.end].long(), row.start, images[i], i)
                for i, row in enumerate(rows)]
