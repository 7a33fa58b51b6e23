"""A tiny checkpoint that thinks: the tiny Llama with DeepSeek-R1's think markers, for the
reasoning tests (``--reasoning-parser deepseek_r1``, ``thinking_token_budget``).

vLLM's ``deepseek_r1`` parser, and the reasoning config the budget is forced from, need
``<think>`` and ``</think>`` as single tokens of the vocabulary; the tiny tokenizer has neither.
This adds both past the vocabulary as plain added tokens (not special, so the detokenized text
keeps them, as in R1's own tokenizer), grows the embedding (tied with the output head) by two
small seeded rows, and makes the chat template open a think section after the assistant tag,
as R1's template does: every chat answer starts inside ``<think>``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

STAMP = ".vllm-tt-reasoning.json"
THINK_START, THINK_END = "<think>", "</think>"
_NEW_ROW_SCALE = 0.1
"""The new rows' size relative to the embedding's spread: small, so that an untrained model
rarely ends a think section by itself and the budget is what ends it."""


def build_reasoning_checkpoint(base: Path, out: Path) -> Path:
    """``base`` (a tiny checkpoint with tied embeddings) plus the think markers, into ``out``
    (idempotent)."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer

    recipe = {"base": base.name, "markers": [THINK_START, THINK_END], "scale": _NEW_ROW_SCALE}
    stamp = out / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        return out
    out.mkdir(parents=True, exist_ok=True)
    for path in base.iterdir():
        if path.is_file() and not path.name.startswith("."):
            shutil.copy2(path, out / path.name)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    tokenizer.save(str(out / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    config = json.loads((base / "config.json").read_text())
    if not config.get("tie_word_embeddings"):
        raise ValueError(f"{base}: the reasoning checkpoint grows one tied embedding; this one has a separate head")
    config["vocab_size"] = vocab
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = load_file(base / "model.safetensors")
    name = next(n for n in weights if n.endswith("embed_tokens.weight"))
    table = weights[name]
    rows = torch.randn(vocab - table.shape[0], table.shape[1], generator=torch.Generator().manual_seed(0))
    weights[name] = torch.cat([table, (rows * table.std() * _NEW_ROW_SCALE).to(table.dtype)])
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    tokenizer_config = json.loads((base / "tokenizer_config.json").read_text())
    template = tokenizer_config["chat_template"]
    generation_prompt = "{{ '<|assistant|>\\n' }}"
    if generation_prompt not in template:
        raise ValueError(f"{base}: its chat template has no assistant prompt {generation_prompt!r} to open a think in")
    tokenizer_config["chat_template"] = template.replace(generation_prompt, "{{ '<|assistant|>\\n" + THINK_START + "' }}")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    stamp.write_text(json.dumps(recipe) + "\n")
    return out


def cached_reasoning_checkpoint() -> Path:
    """The untrained tiny Llama with the think markers, built once per machine
    (``checkpoints.cached``)."""
    from vllm_tt_testing.checkpoints import cached, cached_tiny

    base = cached_tiny("llama")
    return cached("reasoning-llama", lambda out: build_reasoning_checkpoint(base, out), base.name)
