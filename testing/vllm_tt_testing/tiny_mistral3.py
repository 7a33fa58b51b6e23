"""A tiny Mistral 3 checkpoint built from nothing: the host tiny model's locally trained BPE plus
Mistral's instruction and image tokens (``[INST]``, ``[/INST]``, ``[IMG]``, ``[IMG_BREAK]``,
``[IMG_END]``) and a Mistral-style chat template, the Pixtral image processor (4-pixel patches,
merge 2: a 32x32 image is 4 rows of 4 ``[IMG]`` tokens, rows split by ``[IMG_BREAK]`` and ended
by ``[IMG_END]``; a larger image is scaled to fit 32 pixels, keeping its aspect ratio, so
that one image is at most 20 tokens), random weights trained briefly on the
shipped corpus and on the shared captioning task (``tiny_vl``) so that greedy margins are not
ties and the image decides the answer. Saved with ``save_pretrained`` so vLLM loads it offline.
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

__all__ = ["KINDS", "build_tiny_mistral3", "synthetic_image", "user_message"]

INST, INST_END = "[INST]", "[/INST]"
IMAGE, IMAGE_BREAK, IMAGE_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
PATCH, MERGE, LONGEST_EDGE = 4, 2, 32
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}[IMG]"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
TRAIN_STEPS = 150
STAMP = ".vllm-tt-tiny-mistral3.json"
RECIPE = {"format": 1, "train_steps": TRAIN_STEPS, "kinds": KINDS, "patch": PATCH, "merge": MERGE,
          "longest_edge": LONGEST_EDGE}


def build_processor() -> Any:
    import vllm_tt_host.tiny as tiny
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    tok = tiny.build_tokenizer()
    specials = [INST, INST_END, IMAGE, IMAGE_BREAK, IMAGE_END]
    tok.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=tiny.BOS, eos_token=tiny.EOS, pad_token=tiny.PAD, unk_token=None,
        additional_special_tokens=specials, model_max_length=tiny.MAX_POSITIONS, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    images = PixtralImageProcessor(size={"longest_edge": LONGEST_EDGE}, patch_size={"height": PATCH, "width": PATCH},
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return PixtralProcessor(images, tokenizer, patch_size=PATCH, spatial_merge_size=MERGE, chat_template=CHAT_TEMPLATE)


def build_config(tokenizer: Any) -> Any:
    from transformers import Mistral3Config

    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    config = Mistral3Config(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         sliding_window=None, rms_norm_eps=1e-5, rope_theta=10000.0, **special),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           head_dim=8, image_size=LONGEST_EDGE, patch_size=PATCH, hidden_act="silu"),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE), spatial_merge_size=MERGE,
        tie_word_embeddings=False, **special,
    )
    config.architectures = ["Mistral3ForConditionalGeneration"]
    return config


def build_tiny_mistral3(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    import torch
    import vllm_tt_host.tiny as tiny
    from transformers import GenerationConfig, Mistral3ForConditionalGeneration

    processor = build_processor()
    tokenizer = processor.tokenizer
    config = build_config(tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Mistral3ForConditionalGeneration(config)
        _train(model, processor, tiny)
    # No eos in the generation config: HF generate() then runs max_new_tokens, as vLLM does with ignore_eos.
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return save(out, model, processor, STAMP, RECIPE)


def _train(model: Any, processor: Any, tiny: Any) -> None:
    import torch

    tokenizer = processor.tokenizer
    prompt = processor.apply_chat_template(user_message(1, QUESTION), add_generation_prompt=True, tokenize=False)
    caption_of = captions(tiny)
    placeholders = torch.tensor(tokenizer.convert_tokens_to_ids([IMAGE, IMAGE_BREAK, IMAGE_END]))

    def caption_batch(step: int) -> tuple[dict[str, Any], Any]:
        kinds = [(step * 4 + i) % KINDS for i in range(4)]
        texts = [prompt + caption_of[k] + tiny.EOS for k in kinds]
        images = [synthetic_image(k, 1000 * step + i) for i, k in enumerate(kinds)]
        inputs = processor(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
        ignored = (inputs["attention_mask"] == 0) | torch.isin(inputs["input_ids"], placeholders)
        return dict(inputs), inputs["input_ids"].masked_fill(ignored, -100)

    train_captioning(model, tiny._corpus_ids(processor.tokenizer.backend_tokenizer), caption_batch, TRAIN_STEPS)
