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
