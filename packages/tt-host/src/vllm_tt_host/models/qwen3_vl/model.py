"""Qwen3-VL: the Qwen 3 decoder (q/k norms) with interleaved mRoPE, its vision tower, and
DeepStack.

The Qwen-VL frame of ``qwen2_5_vl.model`` does the rest: placeholder runs, mRoPE indices
(Qwen3-VL's image positions are Qwen2.5-VL's) and deltas, images across chunks and prefix-cache
hits. What differs is the tower (``qwen3_vl.vision``), which rotated pair turns with which index
(``interleaved_mrope``), and that an image gives the decoder more than its placeholder
embeddings: the DeepStack features, carried to the layers that add them as
``PrefillInserts.layer_adds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration as VllmQwen3VL

from vllm_tt_host.models.frame.checkpoint import WeightFolder
from vllm_tt_host.models.frame.vision import PixelNorm
from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.qwen2_5_vl.model import HostQwenVLModel, QwenVLConfig, QwenVLDecoder
from vllm_tt_host.models.qwen3_vl.vision import Qwen3VisionConfig, Qwen3VisionTower, load_qwen3_vision_weights


@dataclass(frozen=True)
class Qwen3VLConfig(QwenVLConfig):
    vision: Qwen3VisionConfig = field(kw_only=True)
    vision_type = Qwen3VisionConfig
    interleaved_mrope = True
    video_frame_runs = True


class Qwen3VLDecoder(QwenVLDecoder):
    config: Qwen3VLConfig
    tower: Qwen3VisionTower

    @classmethod
    def load_tower(cls, reader: WeightFolder, prefix: str, config: Qwen3VLConfig, norm: PixelNorm,
                   ) -> Qwen3VisionTower:
        return Qwen3VisionTower(config.vision, load_qwen3_vision_weights(reader, prefix, config.vision), norm)

    def encode(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        return self.tower(pixels, grid)


@vllm_multimodal_processing(VllmQwen3VL)
class HostQwen3VLForConditionalGeneration(HostQwenVLModel):
    """Qwen3-VL with images and videos (dense text side): as Qwen2.5-VL through the contract
    (prefill rows carry ``pixel_values`` + ``image_grid_thw`` and ``pixel_values_videos`` +
    ``video_grid_thw``, prefill returns ``(out, rope_deltas)``, decode takes
    ``rope_deltas_all_users``); DeepStack stays inside the prefill pass."""

    family = "qwen3"
    model_capabilities: ClassVar[dict[str, Any]] = {**HostQwenVLModel.model_capabilities,
                                                    "modalities": ("image", "video")}
    config_type = Qwen3VLConfig
    decoder_type = Qwen3VLDecoder
    decoder: Qwen3VLDecoder
