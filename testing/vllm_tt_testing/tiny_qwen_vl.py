"""A tiny Qwen2.5-VL checkpoint built from nothing: the host tiny model's locally trained BPE
plus the Qwen image special tokens and a Qwen-style chat template (image and video parts), an
image processor (4-pixel patches, merge 2, so a 32x32 image is 16 tokens), random weights
trained briefly on the shipped corpus and on a synthetic captioning task (four kinds of
synthetic image, each with its own caption), so that greedy margins are not ties and the image
decides what follows it. Saved with ``save_pretrained`` (model, processor, tokenizer, chat
template) so vLLM loads it offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_tt_testing.tiny_vl import (
    KINDS,
    QUESTION,
    built,
    captions,
    save,
    synthetic_image,
    train_captioning,
    user_message,
)

__all__ = ["KINDS", "build_tiny_qwen_vl", "synthetic_image", "user_message"]

IMAGE_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' or 'video' in item or 'video_url' in item %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAIN_STEPS = 150
STAMP = ".vllm-tt-tiny-qwen-vl.json"
RECIPE = {"format": 1, "train_steps": TRAIN_STEPS, "kinds": KINDS}


def build_tiny_qwen_vl(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    return build_qwen_vl(
        out, STAMP, RECIPE, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
        Qwen2VLVideoProcessor, text={},
        vision=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
                    spatial_merge_size=2, window_size=16, out_hidden_size=64, fullatt_block_indexes=[1]),
    )


def build_qwen_vl(out: Path, stamp: str, recipe: dict[str, Any], config_cls: Any, model_cls: Any, processor_cls: Any,
                  video_processor_cls: Any, *, text: dict[str, Any], vision: dict[str, Any],
                  pixel_norm: dict[str, Any] | None = None, steps: int = TRAIN_STEPS) -> Path:
    """A tiny Qwen-VL family checkpoint: ``config_cls`` with the shared text sizes (plus
    ``text``) and ``vision``, the shared tokenizer and image processor (``pixel_norm``: its
    mean / std, else Qwen2-VL's defaults), trained ``steps`` steps on the captioning task,
    saved into ``out``."""
    import torch
    import vllm_tt_host.tiny as tiny
    from transformers import GenerationConfig, PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    tok = tiny.build_tokenizer()
    tok.add_special_tokens(list(IMAGE_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=tiny.BOS, eos_token="<|im_end|>", pad_token=tiny.PAD, unk_token=None,
        additional_special_tokens=list(IMAGE_TOKENS), model_max_length=tiny.MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    grid = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
            "size": {"shortest_edge": 16 * 16, "longest_edge": 64 * 64}, **(pixel_norm or {})}
    processor = processor_cls(image_processor=Qwen2VLImageProcessor(**grid), video_processor=video_processor_cls(**grid),
                              tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    ids = {name: tok.token_to_id(name) for name in IMAGE_TOKENS}
    special = {"bos_token_id": tok.token_to_id(tiny.BOS), "pad_token_id": tok.token_to_id(tiny.PAD),
               "eos_token_id": ids["<|im_end|>"]}
    config = config_cls(
        text_config=dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=tiny.MAX_POSITIONS, **special,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         ) | text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False, **special,
    )
    config.architectures = [model_cls.__name__]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_cls(config)
        _train(model, processor, tok, tiny, steps)
    model.eval()
    # No eos in the generation config: HF generate() then runs max_new_tokens, as vLLM does with ignore_eos.
    model.generation_config = GenerationConfig(bos_token_id=special["bos_token_id"],
                                               pad_token_id=special["pad_token_id"])
    return save(out, model, processor, stamp, recipe)


def _train(model: Any, processor: Any, tok: Any, tiny: Any, steps: int) -> None:
    caption_of = captions(tiny)

    def caption_batch(step: int) -> tuple[dict[str, Any], Any]:
        kinds = [(step * 4 + i) % KINDS for i in range(4)]
        prompts = [processor.apply_chat_template(user_message(1, QUESTION), add_generation_prompt=True,
                                                 tokenize=False)
                   + caption_of[k] + "<|im_end|>" for k in kinds]
        images = [synthetic_image(k, 1000 * step + i) for i, k in enumerate(kinds)]
        inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True)
        return inputs, inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)

    train_captioning(model, tiny._corpus_ids(tok), caption_batch, steps)
