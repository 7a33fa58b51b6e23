"""What the host vision-language families share: the tower config every ViT-style
``vision_config`` spells the same way, the image processor's pixel normalisation, and where a
prefill row's images sit among its tokens (placeholder runs, which of them a pass computes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.config import model_name, positive_int, vision_activation
from vllm_tt_host.models.frame.shapes import HostModelInputError


@dataclass(frozen=True)
class VisionTowerConfig:
    """The numbers of a ``vision_config`` every patch-grid tower reads the same way."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_channels: int
    image_size: int
    """The longest image side the processor produces."""
    patch_size: int
    activation: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @staticmethod
    def tower_fields(hf_vision: Any, activations: tuple[str, ...]) -> dict[str, Any]:
        """These fields from ``hf_vision``, the activation (one of ``activations``) first."""
        model = model_name(hf_vision)
        activation = vision_activation(hf_vision, model, activations)
        return {
            "hidden_size": positive_int(hf_vision, "hidden_size", model),
            "intermediate_size": positive_int(hf_vision, "intermediate_size", model),
            "num_layers": positive_int(hf_vision, "num_hidden_layers", model),
            "num_heads": positive_int(hf_vision, "num_attention_heads", model),
            "num_channels": positive_int(hf_vision, "num_channels", model),
            "image_size": positive_int(hf_vision, "image_size", model),
            "patch_size": positive_int(hf_vision, "patch_size", model),
            "activation": activation,
        }


def text_and_vision(hf_config: Any, fix: str) -> tuple[Any, Any]:
    """A vision-language config's ``text_config`` and ``vision_config``, both required (``fix``:
    what to serve instead)."""
    text, vision = getattr(hf_config, "text_config", None), getattr(hf_config, "vision_config", None)
    if text is None or vision is None:
        raise TTConfigError(f"{model_name(hf_config)}: text_config/vision_config", None, "both present", fix)
    return text, vision


CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""Qwen2-VL's image processor defaults, used when the checkpoint saved no processor."""


@dataclass(frozen=True)
class PixelNorm:
    """The image processor's rescale and per-channel normalisation (applied to uint8 input)."""

    rescale: float = 1 / 255
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD

    @classmethod
    def of_checkpoint(cls, folder: Path) -> PixelNorm:
        """From ``processor_config.json`` (transformers 5) or ``preprocessor_config.json``."""
        for name in ("processor_config.json", "preprocessor_config.json"):
            path = folder / name
            if path.is_file():
                raw: dict[str, Any] = json.loads(path.read_text())
                raw = raw.get("image_processor", raw)
                return cls(float(raw.get("rescale_factor", 1 / 255)), tuple(raw.get("image_mean", CLIP_MEAN)),
                           tuple(raw.get("image_std", CLIP_STD)))
        return cls()

    def apply(self, pixels: torch.Tensor, channels: int) -> torch.Tensor:
        """``[patches, C * k]`` uint8 -> normalised float32, as the HF processor computes it
        (``(x - mean / rescale) / (std / rescale)``); float input is returned as float32."""
        if pixels.dtype != torch.uint8:
            return pixels.to(torch.float32)
        x = pixels.to(torch.float32).reshape(pixels.shape[0], channels, -1)
        mean = torch.tensor(self.mean, dtype=torch.float32)[:, None] / self.rescale
        std = torch.tensor(self.std, dtype=torch.float32)[:, None] / self.rescale
        return ((x - mean) / std).reshape(pixels.shape[0], -1)


def per_row(values: Any, rows: int, name: str) -> list[Any]:
    """The runner's row-aligned ``values`` (``pixel_values``, ``image_grid_thw``...): one entry
    per prefill row, None for a row without images; None for the whole call: no row has any."""
    if values is None:
        return [None] * rows
    if not isinstance(values, (list, tuple)) or len(values) != rows:
        raise HostModelInputError(f"{name} must be a list of {rows} rows (None for text-only rows)")
    return list(values)


def image_runs(ids: torch.Tensor, image_token_id: int) -> list[tuple[int, int]]:
    """``[first, stop)`` of every maximal run of ``image_token_id`` in ``ids``, in order."""
    is_image = torch.cat((torch.tensor([False]), ids == image_token_id, torch.tensor([False])))
    edges = (is_image[1:].int() - is_image[:-1].int()).nonzero().flatten().tolist()
    return list(zip(edges[::2], edges[1::2], strict=True))


def live_images(spans: list[tuple[int, int]], start: int, images: list[Any] | None, row: int,
                what: str = "images") -> dict[int, Any]:
    """``{span index: image}`` for the image placeholder spans (``[first, stop)``, prompt
    order) a pass of row ``row`` from position ``start`` computes. The runner sends all of the
    request's images (the contract has no encoder cache; later ones may lie past the chunk),
    or only those the chunk computes."""
    live = [k for k, (_, stop) in enumerate(spans) if stop > start]
    count = 0 if images is None else len(images)
    if count >= len(spans):  # all images so far (and maybe later ones), in prompt order
        image_of = live
    elif count == len(live):  # the chunk's images only
        image_of = list(range(count))
    else:
        raise HostModelInputError(
            f"prefill row {row}: {count} {what} sent, but the tokens hold {len(spans)} image "
            f"placeholder runs, {len(live)} of them in the chunk from position {start}"
        )
    if images is None:
        return {}
    return {k: images[i] for k, i in zip(live, image_of, strict=True)}


def computed_pixels[Pixels](pixels: dict[int, Pixels | None], row: int, start: int) -> list[Pixels]:
    """The pixels of the images a prefill pass of row ``row`` computes from position ``start``
    (``{placeholder run: pixels}``), in order. vLLM sends an image inside the prefix-cache hit
    without data (None), but no pass computes such an image: one it does compute must have its
    pixels. ``Pixels``: an image's data as the family carries it (a tensor; Gemma 4: its
    patches and their positions)."""
    missing = [k for k, p in pixels.items() if p is None]
    if missing:
        raise HostModelInputError(
            f"prefill row {row}: image placeholder runs {missing} are computed from position {start} "
            "but their pixel values were not sent"
        )
    return [p for p in pixels.values() if p is not None]
