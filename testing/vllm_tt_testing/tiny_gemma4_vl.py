"""A tiny Gemma 4 vision-language checkpoint built from nothing, saved with its whole processor
(Gemma 4 image processor with 4-pixel patches, video processor and audio feature extractor as
the processor class requires them, a Gemma-style tokenizer trained here with Gemma 4's image,
audio, video and turn tokens, a chat template that writes one image token per image part and
one video token per video part) so vLLM loads it offline.

The text side has Gemma 4's traits: sliding and full layers with their own head sizes, full
layers whose values are their keys, KV-shared last layers, per-layer input embeddings (as the
E2B / E4B checkpoints that carry the vision tower) and bidirectional attention over each image
on the sliding layers (``use_bidirectional_attention: "vision"``). The processor resizes each
image, keeping its aspect ratio, to at most 630 patches (``max_soft_tokens`` 70, pooled 3x3):
a square image is 24x24 patches, 64 image tokens between its begin and end markers; a wide one
fewer. The model is trained briefly on the shipped corpus and the shared captioning task
(``tiny_vl``), so that the image, not the prompt, decides the answer. The Gemma 4 Unified
checkpoint (``build_tiny_gemma4_unified``) has the same text side without per-layer inputs, the
encoder-free embedder (one image token per 3x3 merged patch: the same token counts) and
Unified's processor.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from vllm_tt_testing.tiny_gemma3_vl import build_gemma_vl, gemma_tokenizer
from vllm_tt_testing.tiny_vl import KINDS, built, synthetic_image, user_message

__all__ = ["KINDS", "build_tiny_gemma4_audio", "build_tiny_gemma4_unified", "build_tiny_gemma4_unified_audio",
           "build_tiny_gemma4_vl", "random_gemma4", "synthetic_image", "user_message"]

PATCH = 4
POOLING = 3
MAX_SOFT_TOKENS = 70
"""The smallest budget the Gemma 4 image processor takes."""
WINDOW = 32
"""Shorter than a square image's 64 tokens: the answer's sliding layers do not see the image."""
BOS, EOS, PAD, UNK = "<bos>", "<eos>", "<pad>", "<unk>"
IMAGE, BOI, EOI = "<|image|>", "<|image>", "<image|>"
AUDIO, BOA, EOA = "<|audio|>", "<|audio>", "<audio|>"
VIDEO = "<|video|>"
TURN_START, TURN_END = "<start_of_turn>", "<end_of_turn>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}<|image|>"
    "{% elif item['type'] == 'video' or 'video' in item or 'video_url' in item %}<|video|>"
    "{% elif item['type'] == 'audio' or 'audio' in item or 'input_audio' in item %}<|audio|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
TRAIN_STEPS = 150
STAMP = ".vllm-tt-tiny-gemma4-vl.json"
RECIPE = {"format": 1, "train_steps": TRAIN_STEPS, "kinds": KINDS, "window": WINDOW}
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def build_processor(paragraphs: list[str], *, unified: bool = False) -> Any:
    """The whole processor (``unified``: Gemma 4 Unified's, which merges each 3x3 square of
    patches into one model patch)."""
    if unified:
        from transformers.models.gemma4_unified import (
            feature_extraction_gemma4_unified as audio,
        )
        from transformers.models.gemma4_unified import (
            image_processing_gemma4_unified as image,
        )
        from transformers.models.gemma4_unified import (
            processing_gemma4_unified as processing,
        )
        from transformers.models.gemma4_unified import (
            video_processing_gemma4_unified as video,
        )

        classes: tuple[Any, ...] = (audio.Gemma4UnifiedAudioFeatureExtractor, image.Gemma4UnifiedImageProcessor,
                   video.Gemma4UnifiedVideoProcessor, processing.Gemma4UnifiedProcessor)
    else:
        from transformers import Gemma4ImageProcessor, Gemma4Processor
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
        from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor

        classes = (Gemma4AudioFeatureExtractor, Gemma4ImageProcessor, Gemma4VideoProcessor, Gemma4Processor)
    features, images, videos, processor = classes

    tokenizer = gemma_tokenizer(
        paragraphs, special=[PAD, EOS, BOS, UNK, BOI, EOI, IMAGE, BOA, EOA, AUDIO, VIDEO, TURN_START, TURN_END],
        named={"image_token": IMAGE, "boi_token": BOI, "eoi_token": EOI, "audio_token": AUDIO, "boa_token": BOA,
               "eoa_token": EOA},
        turns=[TURN_START, TURN_END, VIDEO], chat_template=CHAT_TEMPLATE,
    )
    sizes = {"patch_size": PATCH, "pooling_kernel_size": POOLING, "max_soft_tokens": MAX_SOFT_TOKENS}
    return processor(features(), images(**sizes), tokenizer, videos(**sizes), chat_template=CHAT_TEMPLATE,
                     image_seq_length=MAX_SOFT_TOKENS)


AUDIO_CONFIG: dict[str, Any] = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 8],
    conv_kernel_size=3, attention_chunk_size=4, attention_context_left=5, attention_context_right=0,
    output_proj_dims=24, use_clipped_linears=True,
)
"""A tiny audio tower (``audio=True``): the feature extractor's 128 mel bins, two conformer layers
attending 4 frames back, blocks of 4 queries."""


def build_config(tokenizer: Any, *, bidirectional: str | None = "vision", unified: bool = False,
                 audio: bool = False) -> Any:
    """The tiny model's config (``bidirectional``: its text config's ``use_bidirectional_attention``;
    ``unified``: Gemma 4 Unified's, with the encoder-free embedder and a text side without
    per-layer inputs; ``audio``: with ``AUDIO_CONFIG``, as the E-series checkpoints have one, or
    Unified's encoder-free audio config)."""
    from transformers import Gemma4Config
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", IMAGE), ("boi_token_id", BOI), ("eoi_token_id", EOI), ("video_token_id", VIDEO),
        ("audio_token_id", AUDIO), ("boa_token_id", BOA), ("eoa_token_index", EOA))}
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2, layer_types=LAYER_TYPES,
        sliding_window=WINDOW, max_position_embeddings=1024, final_logit_softcapping=30.0,
        use_bidirectional_attention=bidirectional,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        **special,
    )
    if unified:
        unified_config = Gemma4UnifiedConfig(
            text_config=text, audio_config={} if audio else None, **ids,
            vision_config=dict(patch_size=PATCH, pooling_kernel_size=POOLING, mm_embed_dim=32, output_proj_dims=32,
                               mm_posemb_size=64, num_soft_tokens=MAX_SOFT_TOKENS),
        )
        unified_config.architectures = ["Gemma4UnifiedForConditionalGeneration"]
        return unified_config
    config = Gemma4Config(
        text_config={**text, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": len(tokenizer)},
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            head_dim=8, patch_size=PATCH, pooling_kernel_size=POOLING, position_embedding_size=64,
            default_output_length=MAX_SOFT_TOKENS, standardize=True,
            rope_parameters={"rope_type": "axial", "rope_theta": 100.0},
        ),
        audio_config=AUDIO_CONFIG if audio else None,
        **ids,
    )
    config.architectures = ["Gemma4ForConditionalGeneration"]
    return config


def build_tiny_gemma4_vl(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    from transformers import Gemma4ForConditionalGeneration

    return build_gemma_vl(out, STAMP, RECIPE, model_class=Gemma4ForConditionalGeneration, processor_of=build_processor,
                          config_of=build_config, steps=TRAIN_STEPS, prepare=randomise_vision_buffers,
                          add_special_tokens=False)


UNIFIED_STAMP = ".vllm-tt-tiny-gemma4-unified.json"
UNIFIED_RECIPE = {**RECIPE, "unified": True}


def build_tiny_gemma4_unified(out: Path) -> Path:
    """The Gemma 4 Unified checkpoint (the same text side without per-layer inputs, the
    encoder-free embedder, Unified's processor) into ``out``, idempotent per recipe."""
    if built(out, UNIFIED_STAMP, UNIFIED_RECIPE):
        return out
    from transformers import Gemma4UnifiedForConditionalGeneration

    return build_gemma_vl(out, UNIFIED_STAMP, UNIFIED_RECIPE, model_class=Gemma4UnifiedForConditionalGeneration,
                          processor_of=functools.partial(build_processor, unified=True),
                          config_of=functools.partial(build_config, unified=True), steps=TRAIN_STEPS,
                          prepare=randomise_vision_buffers, add_special_tokens=False)


AUDIO_STAMP = ".vllm-tt-tiny-gemma4-audio.json"
AUDIO_RECIPE = {**RECIPE, "audio": True}


def build_tiny_gemma4_audio(out: Path) -> Path:
    """The Gemma 4 checkpoint with an audio tower (``AUDIO_CONFIG``, as the E-series have) into
    ``out``, idempotent per recipe: trained as the vision one is, its audio tower sharpened
    (``sharpen_audio_tower``) so that the clip decides the answer."""
    if built(out, AUDIO_STAMP, AUDIO_RECIPE):
        return out
    from transformers import Gemma4ForConditionalGeneration

    def prepare(model: Any) -> None:
        randomise_vision_buffers(model)
        sharpen_audio_tower(model)

    return build_gemma_vl(out, AUDIO_STAMP, AUDIO_RECIPE, model_class=Gemma4ForConditionalGeneration,
                          processor_of=build_processor, config_of=functools.partial(build_config, audio=True),
                          steps=TRAIN_STEPS, prepare=prepare, add_special_tokens=False)


UNIFIED_AUDIO_STAMP = ".vllm-tt-tiny-gemma4-unified-audio.json"
UNIFIED_AUDIO_RECIPE = {**UNIFIED_RECIPE, "audio": True}


def build_tiny_gemma4_unified_audio(out: Path) -> Path:
    """The Gemma 4 Unified checkpoint with its encoder-free audio embedder into ``out``,
    idempotent per recipe: trained as the Unified one is, the embedder sharpened."""
    if built(out, UNIFIED_AUDIO_STAMP, UNIFIED_AUDIO_RECIPE):
        return out
    from transformers import Gemma4UnifiedForConditionalGeneration

    def prepare(model: Any) -> None:
        randomise_vision_buffers(model)
        sharpen_audio_tower(model)

    return build_gemma_vl(out, UNIFIED_AUDIO_STAMP, UNIFIED_AUDIO_RECIPE,
                          model_class=Gemma4UnifiedForConditionalGeneration,
                          processor_of=functools.partial(build_processor, unified=True),
                          config_of=functools.partial(build_config, unified=True, audio=True), steps=TRAIN_STEPS,
                          prepare=prepare, add_special_tokens=False)


def sharpen_audio_tower(model: Any) -> None:
    """Scale the audio tower's matrices and embedder up (clip vectors as large as embeddings, not
    the 0.02 init's whisper) and give its per-dimension query scale (zeros at init) values."""
    import torch

    tower = getattr(model.model, "audio_tower", None)  # Gemma 4 Unified has none, only the embedder
    with torch.no_grad():
        for name, weight in ([] if tower is None else tower.named_parameters()):
            if name.endswith("per_dim_scale"):
                weight.normal_(0.0, 0.5)
            elif weight.dim() >= 2:
                weight.mul_(10.0)
        model.model.embed_audio.embedding_projection.weight.mul_(20.0)


def random_gemma4(processor: Any, *, bidirectional: str | None = "vision", unified: bool = False,
                  audio: bool = False) -> Any:
    """An untrained tiny Gemma 4 (``unified``: Unified) model for host parity tests, seeded: the
    recipe's config (``build_config``'s options), the vision buffers randomised, the text side's
    matrices scaled up (sharper logits than the 0.02 init), image and clip vectors as large as
    embeddings."""
    import torch
    from transformers import Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration

    torch.manual_seed(0)
    config = build_config(processor.tokenizer, bidirectional=bidirectional, unified=unified, audio=audio)
    model = (Gemma4UnifiedForConditionalGeneration if unified else Gemma4ForConditionalGeneration)(config)
    randomise_vision_buffers(model)
    with torch.no_grad():
        for weight in model.model.language_model.parameters():
            if weight.dim() == 2:
                weight.mul_(4.0)
        embedder = model.model.embed_vision
        (embedder.multimodal_embedder if unified else embedder).embedding_projection.weight.mul_(20.0)
    if audio:
        sharpen_audio_tower(model)
    return model


def randomise_vision_buffers(model: Any) -> None:
    """Give the tower's standardisation buffers (uninitialised memory in transformers) and its
    position table (all ones; Unified: the embedder's, zeros) seeded values, so that they matter."""
    import torch

    tower = model.model.vision_tower if hasattr(model.model, "vision_tower") else None
    with torch.no_grad():
        if tower is None:
            model.model.embed_vision.pos_embedding.normal_(0, 0.5)
            return
        tower.std_bias.normal_(0, 0.5)
        tower.std_scale.uniform_(0.5, 1.5)
        tower.patch_embedder.position_embedding_table.normal_(0, 0.5)
