"""A tiny Gemma 3 vision-language checkpoint built from nothing, saved with its whole processor
(Gemma 3 image processor, a Gemma-style tokenizer trained here with Gemma 3's image and turn
tokens, a chat template that takes image parts) so vLLM loads it offline.

vLLM's Gemma 3 processor looks up ``"\\n"`` .. ``"\\n\\n\\n\\n"`` to merge the newlines it puts
around each image, so the tokenizer is character BPE with byte fallback and ``▁`` for spaces
(not byte-level), with newline runs as single tokens. transformers starts Gemma 3's projector at
zeros, so the model is trained briefly on the shipped corpus and on the shared captioning task
(``tiny_vl``): the image, not the prompt, decides the answer. The sliding window (16) is shorter
than an image (16 tokens plus its start/end markers), so the answer's sliding layers do not see
the image: only the global layer and the bidirectional image block carry it. The Gemma-family
helpers here (``gemma_tokenizer``, ``build_gemma_vl``) serve the Gemma 4 recipes too.
"""

from __future__ import annotations

from collections.abc import Callable
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

__all__ = ["KINDS", "MM_TOKENS", "build_gemma_vl", "build_tiny_gemma3_vl", "gemma_tokenizer", "synthetic_image",
           "user_message"]

MM_TOKENS = 16
"""Image tokens per image: a 32x32 image is 8x8 patches of 4 pixels, pooled 2x2."""
IMAGE_SIZE = 32
WINDOW = 16
BOS, EOS, PAD, UNK = "<bos>", "<eos>", "<pad>", "<unk>"
BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
TURN_START, TURN_END = "<start_of_turn>", "<end_of_turn>"
VOCAB = 700
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
TRAIN_STEPS = 120
STAMP = ".vllm-tt-tiny-gemma3-vl.json"
RECIPE = {"format": 1, "train_steps": TRAIN_STEPS, "kinds": KINDS, "window": WINDOW}


GEMMA_SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
NEWLINE_RUNS = tuple("\n" * n for n in range(1, 5))
BYTES = tuple(f"<0x{b:02X}>" for b in range(256))
"""Byte-fallback tokens: any character the BPE did not learn."""


def gemma_tokenizer(paragraphs: list[str], *, special: list[str], named: dict[str, str], turns: list[str],
                    chat_template: str, vocab: int = 700) -> Any:
    """A Gemma-style fast tokenizer trained on ``paragraphs``: character BPE with byte fallback,
    ``▁`` for spaces and newline runs as single tokens (vLLM's Gemma processors look them up),
    no bos added (the chat template writes it). ``special``: the special tokens, ids in this
    order (``GEMMA_SPECIALS`` among them); ``named``: the ones the processor reads by name
    (``image_token``...); ``turns``: the other special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=GEMMA_SPECIALS["unk_token"], byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    flat = [p.replace("\n", " ") for p in paragraphs]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[*special, *BYTES],
        initial_alphabet=sorted(set("".join(flat).replace(" ", "▁")) | set("?")), show_progress=False,
    )
    tok.train_from_iterator(flat, trainer=trainer)
    tok.add_tokens([AddedToken(run, normalized=False) for run in NEWLINE_RUNS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, **GEMMA_SPECIALS, extra_special_tokens=named, additional_special_tokens=turns,
        model_max_length=4096, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_gemma_vl(out: Path, stamp: str, recipe: dict[str, Any], *, model_class: Any,
                   processor_of: Callable[[list[str]], Any], config_of: Callable[[Any], Any], steps: int,
                   prepare: Callable[[Any], None] | None = None, **processor_kwargs: Any) -> Path:
    """A Gemma-family vision-language checkpoint (Gemma 3, Gemma 4) into ``out``: the processor
    ``processor_of(corpus paragraphs)``, the model ``model_class(config_of(tokenizer))`` seeded
    (``prepare``: what it changes in the fresh model), trained ``steps`` steps on the corpus and on
    chats (``processor_kwargs`` for the processor) whose answer is the image's caption, then
    ``<end_of_turn>``; the loss skips padding and image tokens."""
    import torch
    import vllm_tt_host.tiny as tiny
    from transformers import GenerationConfig

    paragraphs = [p.strip() for p in tiny.corpus_text().split("\n\n") if p.strip()]
    processor = processor_of(paragraphs)
    tokenizer = processor.tokenizer
    texts = torch.tensor([i for p in paragraphs for i in tokenizer("<bos>" + p + "<eos>")["input_ids"]])
    prompt = processor.apply_chat_template(user_message(1, QUESTION), add_generation_prompt=True, tokenize=False)
    caption_of = captions(tiny)

    def caption_batch(step: int) -> tuple[dict[str, Any], Any]:
        kinds = [(step * 4 + i) % KINDS for i in range(4)]
        chats = [prompt + caption_of[k] + "<end_of_turn>" for k in kinds]
        images = [[synthetic_image(k, 1000 * step + i)] for i, k in enumerate(kinds)]
        inputs = processor(text=chats, images=images, return_tensors="pt", padding=True, **processor_kwargs)
        skipped = (inputs["attention_mask"] == 0) | (inputs["input_ids"] == tokenizer.image_token_id)
        return dict(inputs), inputs["input_ids"].masked_fill(skipped, -100)

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config_of(tokenizer))
        if prepare is not None:
            prepare(model)
        train_captioning(model, texts, caption_batch, steps, text_rows=4)
    # No eos in the generation config: HF generate() then runs max_new_tokens, as vLLM does with ignore_eos.
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return save(out, model, processor, stamp, recipe)


def build_tokenizer(paragraphs: list[str]) -> Any:
    return gemma_tokenizer(
        paragraphs, special=[PAD, EOS, BOS, UNK, BOI, EOI, IMAGE, TURN_START, TURN_END],
        named={"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE}, turns=[TURN_START, TURN_END],
        chat_template=CHAT_TEMPLATE, vocab=VOCAB,
    )


def build_processor(paragraphs: list[str]) -> Any:
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    images = Gemma3ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_mean=[0.5] * 3,
                                  image_std=[0.5] * 3, do_pan_and_scan=False)
    return Gemma3Processor(images, build_tokenizer(paragraphs), chat_template=CHAT_TEMPLATE,
                           image_seq_length=MM_TOKENS)


def build_config(tokenizer: Any) -> Any:
    from transformers import Gemma3Config

    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    config = Gemma3Config(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
            max_position_embeddings=1024, query_pre_attn_scalar=16, final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
            },
            **special,
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=IMAGE_SIZE, patch_size=4, vision_use_head=False),
        mm_tokens_per_image=MM_TOKENS, image_token_index=tokenizer.convert_tokens_to_ids(IMAGE),
        boi_token_index=tokenizer.convert_tokens_to_ids(BOI), eoi_token_index=tokenizer.convert_tokens_to_ids(EOI),
        **special,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


def build_tiny_gemma3_vl(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    from transformers import Gemma3ForConditionalGeneration

    return build_gemma_vl(out, STAMP, RECIPE, model_class=Gemma3ForConditionalGeneration, processor_of=build_processor,
                          config_of=build_config, steps=TRAIN_STEPS)
