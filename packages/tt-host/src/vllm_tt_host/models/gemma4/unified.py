"""Gemma 4 Unified (``Gemma4UnifiedForConditionalGeneration``): images without a vision tower.

The model is the Gemma 4 vision-language one (``vl``: the Gemma 4 text decoder, placeholders
embedded as the pad token, images attended both ways on the sliding layers under
``use_bidirectional_attention: "vision"``) with the encoder-free embedder (``embedder``) in place
of the tower: one image token per merged patch of the processor, and, under
``use_bidirectional_attention: "vision"``, image tokens that see their whole image on every layer
(transformers ORs the image blocks into the full and the sliding masks: past the window too).
vLLM's Gemma 4 Unified processor sends ``pixel_values`` and ``pixel_position_ids`` as the tower
model's does.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from vllm.model_executor.models.gemma4_unified import (
    Gemma4UnifiedForConditionalGeneration as VllmGemma4Unified,
)

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.decoder import PrefillInserts
from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.gemma4.audio import AUDIO_EMBEDDER_PREFIXES, Gemma4AudioTower
from vllm_tt_host.models.gemma4.embedder import (
    Gemma4UnifiedAudioEmbedder,
    Gemma4UnifiedEmbedder,
    UnifiedAudioConfig,
    UnifiedVisionConfig,
    load_embedder_weights,
)
from vllm_tt_host.models.gemma4.vision import Gemma4VisionConfig, Gemma4VisionTower
from vllm_tt_host.models.gemma4.vl import (
    Gemma4VLConfig,
    Gemma4VLDecoder,
    HostGemma4ForConditionalGeneration,
)


class Gemma4UnifiedConfig(Gemma4VLConfig):
    """A ``gemma4_unified`` config: the text decoder's numbers, the embedder's, the placeholders'."""

    @staticmethod
    def read_vision(hf_vision: Any) -> Gemma4VisionConfig | UnifiedVisionConfig:
        return UnifiedVisionConfig.from_hf(hf_vision)

    @staticmethod
    def read_audio(hf_audio: Any) -> UnifiedAudioConfig | None:
        return None if hf_audio is None else UnifiedAudioConfig.from_hf(hf_audio)


class Gemma4UnifiedDecoder(Gemma4VLDecoder):
    blocks_past_window = True

    def _image_blocks(self, index: int, inserts: PrefillInserts | None) -> torch.Tensor | None:
        """Every layer's, full ones too (transformers ORs the image blocks into each layer's mask)."""
        return inserts.blocks if self.config.images_both_ways and inserts is not None else None

    @staticmethod
    def load_encoder(reader: WeightFolder, config: Gemma4VLConfig) -> Gemma4VisionTower | Gemma4UnifiedEmbedder:
        vision = cast(UnifiedVisionConfig, config.vision)  # what read_vision makes
        return Gemma4UnifiedEmbedder(vision, load_embedder_weights(reader, vision))

    @staticmethod
    def load_audio(reader: WeightFolder, config: Gemma4VLConfig) -> Gemma4AudioTower | Gemma4UnifiedAudioEmbedder:
        """The encoder-free audio embedder (``config.audio`` is set)."""
        audio = cast(UnifiedAudioConfig, config.audio)  # what read_audio makes
        prefix = reader.prefix(AUDIO_EMBEDDER_PREFIXES, "embedding_projection.weight", "audio embedder")
        projection = reader.tensor(f"{prefix}embedding_projection.weight")
        check_shapes({f"{prefix}embedding_projection.weight": (projection, (config.hidden_size, audio.embed_dim))},
                     reader.folder, implied_by="the text and audio configs")
        return Gemma4UnifiedAudioEmbedder(audio, projection)


@vllm_multimodal_processing(VllmGemma4Unified)
class HostGemma4UnifiedForConditionalGeneration(HostGemma4ForConditionalGeneration):
    """Gemma 4 Unified with images: as Gemma 4 with images, each merged patch embedded on its own."""

    config_type = Gemma4UnifiedConfig
    decoder_type = Gemma4UnifiedDecoder
    model_capabilities = {**HostGemma4ForConditionalGeneration.model_capabilities, "supports_prefix_caching": False,
                          "modalities": ("image", "video", "audio")}
    """No prefix caching: a hit may start inside an image whose tokens reach further back than the
    sliding window vLLM keeps (an image token sees its whole image on every layer). Images,
    videos (frame by frame through the embedder) and audio (through its audio embedder)."""
