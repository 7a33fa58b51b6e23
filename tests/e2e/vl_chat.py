"""Vision-language requests for the end-to-end tests: synthetic images of the tiny recipes
(``vllm_tt_testing.tiny_vl``), the chat prompt, OpenAI chat bodies with base64 ``image_url``
data URLs, and transformers' greedy answer for the same prompt and images."""

from __future__ import annotations

import base64
import io
from typing import Any

from vllm_tt_testing.tiny_vl import QUESTION, synthetic_image, user_message


def images(kinds: tuple[int, ...], salt: int = 0) -> list[Any]:
    """PIL images of these kinds; two of one kind (or another ``salt``) differ in their pixels."""
    from PIL import Image

    return [Image.fromarray(synthetic_image(k, 100 * salt + 10 * i + k)) for i, k in enumerate(kinds)]


def chat_text(processor: Any, count: int, question: str = QUESTION) -> str:
    return processor.apply_chat_template(user_message(count, question), add_generation_prompt=True, tokenize=False)


def hf_generate(hf_vl: tuple[Any, Any], kinds: tuple[int, ...], max_tokens: int, salt: int = 0, *,
                nested: bool = False, add_special_tokens: bool = True,
                question: str = QUESTION) -> tuple[list[int], list[int]]:
    """HF's (prompt ids, greedy new tokens) for the chat prompt with these images. ``nested``:
    the processor takes one list of images per prompt (Gemma 3); ``add_special_tokens`` off
    tokenizes as a chat endpoint does (the rendered template already holds bos)."""
    import torch

    model, processor = hf_vl
    pictures = images(kinds, salt)
    inputs = processor(text=[chat_text(processor, len(kinds), question)],
                       images=([pictures] if nested else pictures) if pictures else None,
                       return_tensors="pt", add_special_tokens=add_special_tokens)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt):].tolist()


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(model: str, parts: list[dict[str, Any]], max_tokens: int, question: str = QUESTION) -> dict[str, Any]:
    """A greedy chat request (image parts, then the question) that returns its token ids."""
    return {"model": model, "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}],
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def image_parts(kinds: tuple[int, ...], salt: int) -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images(kinds, salt)]
