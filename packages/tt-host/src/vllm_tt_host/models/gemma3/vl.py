"""Gemma 3 vision-language (``Gemma3ForConditionalGeneration``) on the host decoder.

The text side is the Gemma 3 text model (``gemma3``: hybrid KV, sliding windows); what the
images add happens only in prefill. Each image (each pan-and-scan crop) runs through the
SigLIP tower, its patch grid is average-pooled to ``mm_tokens_per_image`` tokens, RMS-normed
(``1 + w``) and projected to the text width; those vectors replace the embeddings of the
image's placeholder tokens (runs of ``image_token_id``, unscaled, as transformers does), and
the tokens of one image attend to each other both ways while everything else stays causal
(transformers' ``token_type_ids`` blocks). Decode is the text model's.

vLLM sends Gemma 3's pixel values normalised by the HF image processor (Gemma 3 does not take
vLLM's on-device normalisation), so uint8 pixels are refused rather than guessed at.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from vllm.model_executor.models.gemma3_mm import Gemma3ForConditionalGeneration as VllmGemma3
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import CheckpointError, DecoderWeights, WeightFolder
from vllm_tt_host.models.frame.config import model_name
from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM
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
from vllm_tt_host.models.gemma3.model import (
    Gemma3Config,
    Gemma3Decoder,
    HostGemma3ForCausalLM,
    load_gemma3_weights,
)
from vllm_tt_host.models.gemma3.siglip import SiglipConfig, SiglipVisionTower, load_siglip_weights

TEXT_PREFIXES: tuple[str, ...] = ("language_model.model.", "model.language_model.")
"""Where checkpoints keep the text decoder (transformers 5 writes the first)."""
VISION_PREFIXES: tuple[str, ...] = (
    "vision_tower.", "model.vision_tower.", "vision_tower.vision_model.", "model.vision_tower.vision_model.",
)
PROJECTOR_PREFIXES: tuple[str, ...] = ("multi_modal_projector.", "model.multi_modal_projector.")


@dataclass(frozen=True)
class Gemma3VLConfig(Gemma3Config):
    """The text decoder's numbers plus the vision tower's and the image placeholders'."""

    vision: SiglipConfig = field(kw_only=True)
    mm_tokens_per_image: int = 256
    image_token_id: int = -1

    @property
    def tokens_per_side(self) -> int:
        return int(round(self.mm_tokens_per_image**0.5))

    @classmethod
    def read(cls, hf_config: Any, family: str = "gemma3", *, n_layers: int | None = None) -> Gemma3VLConfig:
        """Read a ``Gemma3Config`` (``text_config`` + ``vision_config``)."""
        model = model_name(hf_config)
        text_config, vision_config = text_and_vision(
            hf_config, "serve a Gemma 3 vision-language checkpoint, or a text one as Gemma3ForCausalLM",
        )
        text = Gemma3Config.read(text_config, family, n_layers=n_layers)
        vision = SiglipConfig.from_hf(vision_config)
        tokens = getattr(hf_config, "mm_tokens_per_image", None)
        side = int(round(tokens**0.5)) if isinstance(tokens, int) and tokens > 0 else 0
        if side * side != tokens or vision.patches_per_side % side:
            raise TTConfigError(
                f"{model}: mm_tokens_per_image", tokens,
                f"a square whose side divides the {vision.patches_per_side} patches per image side",
                "check the checkpoint's config.json",
            )
        image_token = getattr(hf_config, "image_token_id", None)
        if image_token is None:
            image_token = getattr(hf_config, "image_token_index", None)
        if not isinstance(image_token, int) or image_token < 0:
            raise TTConfigError(f"{model}: image_token_id", image_token, "a token id", "check config.json")
        fields = {f.name: getattr(text, f.name) for f in dataclasses.fields(text)}
        return cls(**fields, vision=vision, mm_tokens_per_image=tokens, image_token_id=image_token)


@dataclass(frozen=True)
class ProjectorWeights:
    norm: torch.Tensor
    """``mm_soft_emb_norm`` weight ``[vision hidden]`` (applied as ``1 + w``)."""
    projection: torch.Tensor
    """``mm_input_projection_weight [vision hidden, text hidden]`` (x @ W, not a Linear)."""


class Gemma3Projector:
    """Patch states of the tower -> ``mm_tokens_per_image`` vectors in the text width."""

    def __init__(self, config: Gemma3VLConfig, weights: ProjectorWeights) -> None:
        self.vision = config.vision
        self.side = config.tokens_per_side
        self.weights = weights

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """``[n, patches, vision hidden]`` -> ``[n, mm_tokens_per_image, text hidden]``."""
        n, _, hidden = states.shape
        grid = self.vision.patches_per_side
        kernel = grid // self.side
        pooled = F.avg_pool2d(states.transpose(1, 2).reshape(n, hidden, grid, grid), kernel, kernel)
        pooled = pooled.flatten(2).transpose(1, 2)
        normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + self.vision.layer_norm_eps)
        return (normed * (1.0 + self.weights.norm)) @ self.weights.projection


class Gemma3VLDecoder(Gemma3Decoder):
    config: Gemma3VLConfig

    def __init__(
        self, config: Gemma3VLConfig, weights: DecoderWeights, tower: SiglipVisionTower, projector: Gemma3Projector
    ) -> None:
        super().__init__(config, weights)
        self.tower = tower
        self.projector = projector

    @classmethod
    def load(cls, folder: Path, config: Gemma3VLConfig) -> HostDecoder:
        return load_gemma3_vl_decoder(folder, config)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        # An image token outside the vocabulary embeds as token 0; its row is replaced anyway.
        return super()._embed(torch.where(ids < self.config.vocab_size, ids, 0))

    @torch.no_grad()
    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[crops, channels, size, size]`` -> ``[crops, mm_tokens_per_image, hidden]``."""
        return self.projector(self.tower(pixel_values))

    def inserts(self, ids: torch.Tensor, start: int, crops: list[torch.Tensor | None] | None,
                row: int) -> PrefillInserts | None:
        """Row ``row``'s images for computing ``[start, len(ids))``: ``ids`` is its token
        history up to the chunk end, ``crops`` its images' crops ``[c, h, w]`` in prompt order
        (None: no images sent; a None crop: an image inside the prefix-cache hit, sent without
        data). The runner sends all of the request's images (the contract has no encoder
        cache), or only those the chunk computes; an image whose placeholder run the chunk end
        cuts is an error. Only the images the chunk computes run the vision tower."""
        runs = image_runs(ids, self.config.image_token_id)
        wanted = self.config.mm_tokens_per_image
        for first, stop in runs:
            if stop - first != wanted:
                raise HostModelInputError(
                    f"prefill row {row}: an image's placeholder run at {first}..{stop} has {stop - first} "
                    f"tokens, the model expects mm_tokens_per_image={wanted} (or the chunk end cuts an "
                    "image: the runner must not split one across prefill chunks)"
                )
        if crops is not None and len(crops) < len(runs) and all(c is None for c in crops):
            # Every image lies inside the prefix-cache hit: one None each, whatever its crops.
            crops = [None] * len(runs)
        live = live_images(runs, start, crops, row, "image crops")
        if not live:
            return None
        computed = computed_pixels(live, row, start)
        features = self.image_features(torch.stack(computed))
        blocks = torch.full((ids.shape[0],), -1, dtype=torch.long)
        index, vectors = [], []
        for k, crop in zip(live, features, strict=True):
            first, stop = runs[k]
            blocks[first:stop] = k
            lo = max(first, start)
            index.append(torch.arange(lo, stop) - start)
            vectors.append(crop[lo - first :])
        return PrefillInserts(torch.cat(index), torch.cat(vectors), blocks)


def row_crops(pixel_values: Any, rows: int) -> list[list[torch.Tensor | None] | None]:
    """The runner's ``pixel_values`` (a list over rows, each None or a list of per-image
    tensors ``[crops, c, h, w]`` or ``[c, h, w]``, None for an image inside the prefix-cache
    hit) -> per row, its crops ``[c, h, w]`` in prompt order (None: one crop without data), or None."""
    out: list[list[torch.Tensor | None] | None] = []
    for row, images in enumerate(per_row(pixel_values, rows, "pixel_values")):
        if images is None or (isinstance(images, (list, tuple)) and not images):
            out.append(None)
            continue
        tensors = [None if t is None else torch.as_tensor(t)
                   for t in (images if isinstance(images, (list, tuple)) else [images])]
        tensors = [t[None] if t is not None and t.dim() == 3 else t for t in tensors]
        if any(t is not None and t.dtype == torch.uint8 for t in tensors):
            raise HostModelInputError(
                f"pixel_values of row {row} are uint8; Gemma 3 takes the image processor's normalised "
                "floats (serve with --mm-device-do-normalize false)"
            )
        if None in tensors and any(t is not None and t.shape[0] > 1 for t in tensors):
            raise HostModelInputError(
                f"pixel_values of row {row}: an image inside the prefix-cache hit came without data, and "
                "pan-and-scan crops make its share of the placeholder runs unknown (serve with "
                "--no-enable-prefix-caching, or without do_pan_and_scan)"
            )
        crops: list[torch.Tensor | None] = []
        for t in tensors:
            crops.extend([None] if t is None else list(t.to(torch.float32)))
        out.append(crops)
    return out


def load_gemma3_vl_decoder(folder: Path, config: Gemma3VLConfig) -> Gemma3VLDecoder:
    """The text decoder, tower and projector, under the names transformers 5 (or 4) wrote."""
    reader = WeightFolder(folder)
    text = reader.prefix(TEXT_PREFIXES, "embed_tokens.weight", "text decoder")
    vision = reader.prefix(VISION_PREFIXES, "embeddings.patch_embedding.weight", "vision tower")
    projector = reader.prefix(PROJECTOR_PREFIXES, "mm_input_projection_weight", "multimodal projector")
    weights = ProjectorWeights(
        norm=reader.tensor(projector + "mm_soft_emb_norm.weight"),
        projection=reader.tensor(projector + "mm_input_projection_weight"),
    )
    expected = (config.vision.hidden_size, config.hidden_size)
    if tuple(weights.projection.shape) != expected:
        raise CheckpointError(
            f"{projector}mm_input_projection_weight in {folder} has shape {tuple(weights.projection.shape)}, "
            f"config.json implies {expected}"
        )
    tower = SiglipVisionTower(config.vision, load_siglip_weights(reader, vision, config.vision))
    return Gemma3VLDecoder(
        config, load_gemma3_weights(folder, config, text), tower, Gemma3Projector(config, weights)
    )


@vllm_multimodal_processing(VllmGemma3)
class HostGemma3ForConditionalGeneration(HostGemma3ForCausalLM):
    """Gemma 3 with images: prefill rows carry ``pixel_values``; the rest is Gemma 3 text."""

    family = "gemma3"
    config_type = Gemma3VLConfig
    decoder_type = Gemma3VLDecoder
    decoder: Gemma3VLDecoder
    model_capabilities = HybridKVCausalLM.model_capabilities
    """Gemma 3 text's less mixed steps: a mixed step's chunk carries no images."""

    def prefill_inserts(
        self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any]
    ) -> list[PrefillInserts | None]:
        """Each row's image embeddings and blocks from ``pixel_values`` (see ``row_crops``);
        ``image_sizes``, if sent, is not needed: every crop has the tower's fixed size."""
        crops = row_crops(kwargs.get("pixel_values"), len(rows))
        if self.synthetic is not None:
            return [None] * len(rows)
        return [
            self.decoder.inserts(tokens[i, : row.end].long(), row.start, crops[i], i) for i, row in enumerate(rows)
        ]
