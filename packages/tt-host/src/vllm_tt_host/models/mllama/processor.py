"""vLLM's multimodal processing for Llama 3.2 Vision, which vLLM no longer ships.

Mllama is an encoder-decoder model to vLLM (``vllm_tt_models_registry.encoder_decoder`` marks
its config): the request's token ids are the decoder prompt, the user's text as written (one
``<|image|>`` per image, BOS from the tokenizer or template; vLLM adds no decoder start
token), and the encoder prompt only places the images, each as many placeholder positions as
it has vision keys (``max_num_tiles * patches``: the cross-attention blocks vLLM allocates for
it), every image placed at the encoder prompt's start (see ``apply``). transformers' ``MllamaProcessor`` makes the tiles; each image's ``pixel_values``,
``aspect_ratio_ids`` and ``aspect_ratio_mask`` reach ``prefill_forward`` as the runner passes
any image tensors. The cross-attention mask is not sent: the model derives it from the tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import MultiModalDataItems
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseProcessingInfo,
    EncDecMultiModalProcessor,
    PromptReplacement,
    PromptUpdate,
)

from vllm_tt_host.models.mllama.config import MllamaVisionConfig

IMAGE_TOKEN = "<|image|>"
IMAGE_FIELDS: tuple[str, ...] = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")
"""What the HF processor makes per image (its batch axis dropped); ``cross_attention_mask`` and
``num_tiles`` are not passed on."""


class MllamaProcessingInfo(BaseProcessingInfo):
    def vision(self) -> MllamaVisionConfig:
        return MllamaVisionConfig.from_hf(self.get_hf_config().vision_config)

    def image_token_id(self) -> int:
        return int(self.get_hf_config().image_token_index)

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None}

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        return {"image": self.vision().tokens_per_image}


class MllamaDummyInputsBuilder(BaseDummyInputsBuilder[MllamaProcessingInfo]):
    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return IMAGE_TOKEN * mm_counts.get("image", 0)

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Any = None) -> Any:
        vision = self.info.vision()
        side = vision.image_size * vision.max_num_tiles
        return {"image": self._get_dummy_images(width=side, height=side, num_images=mm_counts.get("image", 0),
                                                overrides=(mm_options or {}).get("image"))}


class MllamaMultiModalProcessor(EncDecMultiModalProcessor[MllamaProcessingInfo]):
    skip_decoder_start_token = True
    """The decoder prompt is the user's own (transformers' ``generate`` prepends nothing)."""

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's inputs with every image's placeholder range moved to offset 0 (its length kept).

        vLLM 0.33's scheduler treats an encoder-decoder model's items as all sitting at the
        start (``v1/core/sched/scheduler.py::_try_schedule_encoder_inputs``: ``lo = 0`` and
        ``assert start_pos == 0`` once a decoder token is computed), but schedules on the first
        prefill only the items that start before the end of the decoder prompt. Laid end to end,
        a second image (offset 34 on the tiny model) would get no cross-attention blocks when
        the decoder prompt is shorter than its offset (vLLM sizes them from the scheduled items),
        and decoding up to its offset would trip that assertion. At offset 0 every image is
        scheduled, and its blocks allocated, on the prompt's one prefill step (also after a
        preemption), and none later."""
        inputs = super().apply(*args, **kwargs)
        placeholders = inputs["mm_placeholders"]
        inputs["mm_placeholders"] = {modality: [dataclasses.replace(r, offset=0) for r in ranges]
                                     for modality, ranges in placeholders.items()}
        return inputs

    def create_encoder_prompt(self, prompt: list[int], mm_items: MultiModalDataItems) -> list[int]:
        return [self.info.image_token_id()] * mm_items.get_count("image", strict=False)

    def _postprocess_hf_mm_data(self, hf_data: Mapping[str, object], hf_kwargs: Mapping[str, object],
                                processed_data: Any) -> Any:
        """One prompt's images: drop the batch axis, keep ``IMAGE_FIELDS``."""
        out = processed_data
        for key in list(out.keys()):
            if key in IMAGE_FIELDS:
                out[key] = out[key][0]
            elif key not in ("input_ids", "attention_mask"):
                del out[key]
        return out

    def _get_mm_fields_config(self, hf_inputs: Any, hf_processor_mm_kwargs: Mapping[str, object],
                              ) -> Mapping[str, MultiModalFieldConfig]:
        return {name: MultiModalFieldConfig.batched("image") for name in IMAGE_FIELDS}

    def _get_prompt_updates(self, mm_items: MultiModalDataItems, hf_processor_mm_kwargs: Mapping[str, object],
                            out_mm_kwargs: MultiModalKwargsItems) -> Sequence[PromptUpdate]:
        token = self.info.image_token_id()
        return [PromptReplacement(modality="image", target=[token],
                                  replacement=[token] * self.info.vision().tokens_per_image)]
