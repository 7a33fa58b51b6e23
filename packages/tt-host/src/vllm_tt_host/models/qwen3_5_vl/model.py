"""Qwen 3.5 vision-language (``Qwen3_5ForConditionalGeneration``) on the host: composed, not
copied. The Qwen-VL frame (``qwen2_5_vl.model``) places the images and their mRoPE indices,
across chunks and decode; Qwen3-VL (``qwen3_vl``) gives the tower and the interleaved axes; the
Qwen 3.5 decoder (``qwen3_5``) gives the layers, and its model the hybrid KV (paged K/V for the
attention layers, one recurrent-state block per request for the delta-nets).

What the composition has to settle: mRoPE turns only the ``rotary_dim`` leading dimensions of
each head (the 3.5 partial rotary), so the mRoPE sections share out ``rotary_dim / 2`` pairs;
and a prefill row computes its real tokens only (padding would advance the recurrent state),
so its mRoPE indices are not padded to the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration as VllmQwen3_5VL

from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.qwen2_5_vl.model import HostQwenVLModel, config_fields
from vllm_tt_host.models.qwen3_5.config import Qwen3_5Config
from vllm_tt_host.models.qwen3_5.model import HostQwen3_5ForCausalLM, Qwen3_5Decoder, load_qwen3_5
from vllm_tt_host.models.qwen3_vl.model import Qwen3VLConfig, Qwen3VLDecoder
from vllm_tt_host.models.qwen3_vl.vision import Qwen3VisionConfig, Qwen3VisionTower


@dataclass(frozen=True)
class Qwen3_5VLConfig(Qwen3_5Config, Qwen3VLConfig):
    """The Qwen 3.5 text config (layer kinds, delta-net shape, rotary part) plus Qwen3-VL's
    image fields and interleaved mRoPE."""

    vision: Qwen3VisionConfig = field(kw_only=True)

    @classmethod
    def read(cls, hf_config: Any, family: str = "qwen3_5", *, n_layers: int | None = None) -> Self:
        text = Qwen3_5Config.read(hf_config, family, n_layers=n_layers)
        return cls(**(config_fields(text) | cls.vl_fields(hf_config, text.rotary_dim // 2)))


class Qwen3_5VLDecoder(Qwen3VLDecoder, Qwen3_5Decoder):
    """The Qwen 3.5 layers with Qwen3-VL's tower and the frame's image rows; the 3.5 rotation
    (``_rotate``, on the rotary part) turns with the mRoPE indices."""

    config: Qwen3_5VLConfig
    tower: Qwen3VisionTower
    pads_prefill = False

    def __init__(self, config: Qwen3_5VLConfig, text: Qwen3_5Decoder, tower: Qwen3VisionTower) -> None:
        Qwen3_5Decoder.__init__(self, config, text.weights.embed, text.layers, text.weights.norm,
                                text.weights.lm_head)
        self.attach_vision(tower, config.rotary_dim)
        self.rotary = self.mrope  # type: ignore[assignment]

    @classmethod
    def with_text(cls, folder: Path, config: Any, text_prefix: str, tower: Any) -> Qwen3_5VLDecoder:
        return cls(config, load_qwen3_5(folder, config, text_prefix), tower)


@vllm_multimodal_processing(VllmQwen3_5VL)
class HostQwen3_5ForConditionalGeneration(HostQwenVLModel, HostQwen3_5ForCausalLM):
    """Qwen 3.5 vision-language (``Qwen3_5ForConditionalGeneration``, images and videos), float32: Qwen3-VL's
    tower on the Qwen 3.5 hybrid decoder (a recurrent-state block per request for each delta-net
    layer, paged KV for the attention layers); prefill rows carry ``pixel_values`` +
    ``image_grid_thw`` (``pixel_values_videos`` + ``video_grid_thw``) and return ``(out,
    rope_deltas)``, decode takes ``rope_deltas_all_users``."""

    family: ClassVar[str] = "qwen3_5"
    model_capabilities: ClassVar[dict[str, Any]] = {
        **HostQwen3_5ForCausalLM.model_capabilities,
        "supports_async_decode": False,  # decode rotates with the host's positions
        # vLLM's align mode (prefix caching) ends chunks on block boundaries, inside an image's
        # span if need be: each pass embeds its row's items whole and places the part it computes.
        "chunked_mm_input": True,
        "modalities": ("image", "video"),
        "supports_verify_decode": False,  # verify steps over image rows: not proven yet (as Qwen-VL's)
        "supports_mtp": False,
    }
    config_type = Qwen3_5VLConfig
    decoder_type = Qwen3_5VLDecoder
    decoder: Qwen3_5VLDecoder
