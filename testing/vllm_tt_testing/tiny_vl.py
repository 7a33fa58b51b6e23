"""What the tiny vision-language recipes share: synthetic images of a few kinds, one caption per
kind, chat messages with image parts, the captioning training loop (corpus text plus
"image -> its kind's caption" chats, so the image decides what follows it) and the recipe stamp
that makes a build idempotent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

KINDS = 4
"""Synthetic image kinds; ``synthetic_image(kind, seed)`` draws one."""
CAPTION_WORDS = 12
QUESTION = "what is it?"


def synthetic_image(kind: int, seed: int, size: tuple[int, int] = (32, 32)) -> np.ndarray:
    """``[h, w, 3]`` uint8: kind 0..3 is a colour split along a direction, plus seeded noise."""
    rng = np.random.default_rng(seed)
    h, w = size
    ys, xs = np.mgrid[0:h, 0:w]
    split = [xs < w // 2, ys < h // 2, xs + ys < (h + w) // 2, (xs // 8 + ys // 8) % 2 == 0][kind % 4]
    colours = np.array([[220, 40, 40], [40, 200, 60], [40, 60, 220], [230, 220, 40]], dtype=np.int16)
    image = np.where(split[..., None], colours[kind % 4], colours[(kind + 2) % 4]).astype(np.int16)
    image += rng.integers(-25, 26, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def user_message(images: int, text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*([{"type": "image"}] * images), {"type": "text", "text": text}]}]


def captions(tiny: Any) -> list[str]:
    """One caption per image kind: the first words of a corpus paragraph."""
    paragraphs = [p.strip() for p in tiny.corpus_text().split("\n\n") if p.strip()]
    return [" ".join(paragraphs[3 * k].split()[:CAPTION_WORDS]) for k in range(KINDS)]


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


CaptionBatch = Callable[[int], tuple[dict[str, Any], Any]]
"""``step -> (model inputs, labels)`` of that step's captioning chats."""


def train_captioning(model: Any, texts: Any, caption_batch: CaptionBatch, steps: int, *, text_rows: int = 8,
                     text_len: int = 64, lr: float = 3e-3) -> None:
    """AdamW on ``text_rows`` random corpus windows plus one captioning batch per step."""
    import torch

    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(texts) - text_len, (text_rows,), generator=generator).tolist()
        batch = torch.stack([texts[s : s + text_len] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        inputs, labels = caption_batch(step)
        loss = loss + model(**inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


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


def built(out: Path, stamp: str, recipe: dict[str, Any]) -> bool:
    """Whether ``out`` already holds the checkpoint of ``recipe``."""
    path = out / stamp
    return path.is_file() and (out / "model.safetensors").is_file() and json.loads(path.read_text()) == recipe


def save(out: Path, model: Any, processor: Any, stamp: str, recipe: dict[str, Any]) -> Path:
    """Write model, processor (tokenizer, chat template) and the stamp, last."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / stamp).write_text(json.dumps(recipe))
    return out
