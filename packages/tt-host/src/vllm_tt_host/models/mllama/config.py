"""``MllamaConfig``: the Llama text decoder's numbers plus its cross-attention layers and the
tiled vision tower's, read from transformers' ``MllamaConfig`` (``text_config`` +
``vision_config``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.config import DecoderConfig, model_name, positive_int
from vllm_tt_host.models.frame.vision import VisionTowerConfig

VISION_ACTIVATIONS: tuple[str, ...] = ("gelu",)
PATCH_ALIGNMENT = 8
"""The tower pads each tile's patches (class token included) to a multiple of this."""


@dataclass(frozen=True)
class MllamaVisionConfig(VisionTowerConfig):
    """The tiled tower: ``max_num_tiles`` tiles of ``image_size`` pixels per image, a local
    encoder (``num_layers``) whose ``intermediate_layers`` outputs are kept, a gated global
    encoder (``num_global_layers``) over all tiles of an image."""

    num_global_layers: int
    max_num_tiles: int
    max_aspect_ratio_id: int
    intermediate_layers: tuple[int, ...]
    output_dim: int
    """``hidden_size * (1 + len(intermediate_layers))``: the projector's input width."""
    norm_eps: float

    @property
    def patches(self) -> int:
        """Vision tokens per tile: the patch grid plus the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def padded_patches(self) -> int:
        return -(-self.patches // PATCH_ALIGNMENT) * PATCH_ALIGNMENT

    @property
    def tokens_per_image(self) -> int:
        """Cross-attention keys per image: every tile slot (padding tiles too) times its tokens."""
        return self.max_num_tiles * self.patches

    @classmethod
    def from_hf(cls, hf_vision: Any) -> MllamaVisionConfig:
        model = model_name(hf_vision)
        fields = cls.tower_fields(hf_vision, VISION_ACTIVATIONS)
        hidden, heads, image, patch = (fields[k] for k in ("hidden_size", "num_heads", "image_size", "patch_size"))
        if hidden % heads or image % patch:
            raise TTConfigError(
                f"{model}: vision_config", {"hidden_size": hidden, "attention_heads": heads, "image_size": image,
                                            "patch_size": patch},
                "hidden_size divisible by attention_heads, image_size by patch_size", "check config.json",
            )
        layers = fields["num_layers"]
        kept = tuple(int(i) for i in getattr(hf_vision, "intermediate_layers_indices", None) or ())
        if not kept or any(not 0 <= i < layers for i in kept):
            raise TTConfigError(f"{model}: vision_config.intermediate_layers_indices", list(kept),
                                f"local layer indices in 0..{layers - 1}", "check config.json")
        output_dim = positive_int(hf_vision, "vision_output_dim", model)
        if output_dim != hidden * (1 + len(kept)):
            raise TTConfigError(f"{model}: vision_config.vision_output_dim", output_dim,
                                f"hidden_size x (1 + {len(kept)} intermediate layers) = {hidden * (1 + len(kept))}",
                                "check config.json")
        return cls(
            **fields, num_global_layers=positive_int(hf_vision, "num_global_layers", model),
            max_num_tiles=positive_int(hf_vision, "max_num_tiles", model),
            max_aspect_ratio_id=len(getattr(hf_vision, "supported_aspect_ratios", None) or ()),
            intermediate_layers=kept, output_dim=output_dim, norm_eps=float(getattr(hf_vision, "norm_eps", 1e-5)),
        )


@dataclass(frozen=True)
class MllamaConfig(DecoderConfig):
    """Llama's decoder where the layers ``cross_attention_layers`` attend to the vision states
    instead of to the text (they hold no self-attention and write no text KV)."""

    vision: MllamaVisionConfig = field(kw_only=True)
    cross_layers: frozenset[int] = field(kw_only=True)
    image_token_id: int = field(kw_only=True)
    embed_rows: int = field(kw_only=True)
    """Rows of ``embed_tokens``: ``vocab_size + 8`` (the embedding holds the image token and spares)."""

    def is_cross(self, layer: int) -> bool:
        return layer in self.cross_layers

    @classmethod
    def read(cls, hf_config: Any, family: str = "llama", *, n_layers: int | None = None) -> MllamaConfig:
        model = model_name(hf_config)
        text, vision = getattr(hf_config, "text_config", None), getattr(hf_config, "vision_config", None)
        if text is None or vision is None:
            raise TTConfigError(f"{model}: text_config/vision_config", None, "both present (model_type mllama)",
                                "serve a Llama 3.2 Vision checkpoint saved by transformers")
        base = DecoderConfig.read(text, family, n_layers=n_layers)
        cross = frozenset(int(i) for i in getattr(text, "cross_attention_layers", None) or ())
        if any(not 0 <= i < base.num_layers for i in cross):
            raise TTConfigError(f"{model}: text_config.cross_attention_layers", sorted(cross),
                                f"layer indices in 0..{base.num_layers - 1}", "check config.json")
        image_token = getattr(hf_config, "image_token_index", None)
        if isinstance(image_token, bool) or not isinstance(image_token, int) or image_token < 0:
            raise TTConfigError(f"{model}: image_token_index", image_token, "a token id", "check config.json")
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return cls(**fields, vision=MllamaVisionConfig.from_hf(vision), cross_layers=cross,
                   image_token_id=image_token, embed_rows=base.vocab_size + 8)
