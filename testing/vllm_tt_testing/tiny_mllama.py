"""A tiny Llama 3.2 Vision (Mllama) checkpoint built from nothing: the host tiny model's locally
trained BPE plus ``<|image|>`` and a Llama-style chat template, transformers'
``MllamaImageProcessor`` configured here (16-pixel tiles, at most 2 per image: a 32x16 image is
two tiles, a square one is one tile padded by a blank one), random weights with 2 of 4 text
layers cross-attention layers, trained briefly on the shipped corpus and on the shared
captioning task (``tiny_vl``) so that greedy margins are not ties and the image decides the
answer (transformers starts every cross-attention gate at 0: training opens them). Saved with
``save_pretrained`` so vLLM loads it offline.
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

__all__ = ["KINDS", "TILE", "build_tiny_mllama", "synthetic_image", "user_message"]

IMAGE = "<|image|>"
TILE, MAX_TILES, PATCH = 16, 2, 4
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}<user>"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}<|image|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</user>"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
TRAIN_STEPS = 150
STAMP = ".vllm-tt-tiny-mllama.json"
RECIPE = {"format": 1, "train_steps": TRAIN_STEPS, "kinds": KINDS, "tile": TILE, "max_tiles": MAX_TILES,
          "patch": PATCH}


def build_processor() -> Any:
    import vllm_tt_host.tiny as tiny
    from transformers import MllamaImageProcessor, MllamaProcessor, PreTrainedTokenizerFast

    tok = tiny.build_tokenizer()
    specials = ["<user>", "</user>", IMAGE]
    tok.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=tiny.BOS, eos_token=tiny.EOS, pad_token=tiny.PAD, unk_token=None,
        additional_special_tokens=specials, model_max_length=tiny.MAX_POSITIONS, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    images = MllamaImageProcessor(size={"height": TILE, "width": TILE}, max_image_tiles=MAX_TILES,
                                  image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return MllamaProcessor(images, tokenizer, chat_template=CHAT_TEMPLATE)


def build_config(tokenizer: Any) -> Any:
    from transformers import MllamaConfig

    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    config = MllamaConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, cross_attention_layers=[1, 3],
                         max_position_embeddings=4096, rms_norm_eps=1e-5, **special),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_global_layers=1,
                           attention_heads=4, image_size=TILE, patch_size=PATCH, max_num_tiles=MAX_TILES,
                           supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]], intermediate_layers_indices=[1],
                           vision_output_dim=64),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE), **special,
    )
    config.architectures = ["MllamaForConditionalGeneration"]
    return config


def build_tiny_mllama(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    import torch
    import vllm_tt_host.tiny as tiny
    from transformers import GenerationConfig, MllamaForConditionalGeneration

    processor = build_processor()
    tokenizer = processor.tokenizer
    config = build_config(tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = MllamaForConditionalGeneration(config)
        _train(model, processor, tiny)
    # No eos in the generation config: HF generate() then runs max_new_tokens, as vLLM does with ignore_eos.
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return save(out, model, processor, STAMP, RECIPE)


def _train(model: Any, processor: Any, tiny: Any) -> None:
    tokenizer = processor.tokenizer
    prompt = processor.apply_chat_template(user_message(1, QUESTION), add_generation_prompt=True, tokenize=False)
    caption_of = captions(tiny)
    image_id = tokenizer.convert_tokens_to_ids(IMAGE)

    def caption_batch(step: int) -> tuple[dict[str, Any], Any]:
        kinds = [(step * 4 + i) % KINDS for i in range(4)]
        texts = [prompt + caption_of[k] + tiny.EOS for k in kinds]
        sizes = [(TILE, TILE), (TILE, 2 * TILE), (2 * TILE, TILE), (2 * TILE, 2 * TILE)]
        images = [[synthetic_image(k, 1000 * step + i, sizes[(step + i) % 4])] for i, k in enumerate(kinds)]
        inputs = processor(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
        ignored = (inputs["attention_mask"] == 0) | (inputs["input_ids"] == image_id)
        return dict(inputs), inputs["input_ids"].masked_fill(ignored, -100)

    train_captioning(model, tiny._corpus_ids(processor.tokenizer.backend_tokenizer), caption_batch, TRAIN_STEPS)
