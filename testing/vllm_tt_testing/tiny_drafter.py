"""A drafter checkpoint for speculative decoding tests: the target's first decoder layers,
saved as a checkpoint of their own (same tokenizer, embeddings and head).

A separately seeded small model would agree with an untrained tiny target almost never, so
its drafts would all miss; the target's own first layer predicts its next token often enough
that verify steps accept some drafts and reject others, which is what the tests need.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

STAMP = ".vllm-tt-drafter.json"
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_VOCAB_ROWS = ("embed_tokens.weight", "lm_head.weight")


def start_derived(target: Path, out: Path, stamp: Path, recipe: dict[str, object]) -> bool:
    """Begin a checkpoint derived from ``target`` in ``out``: False when ``stamp`` already
    records ``recipe`` (built), else the folder made and the target's tokenizer and side files
    copied (not its weights or config, which the builder writes)."""
    if stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        return False
    out.mkdir(parents=True, exist_ok=True)
    for path in target.iterdir():
        if path.is_file() and path.name not in ("model.safetensors", "config.json") and not path.name.startswith("."):
            shutil.copy2(path, out / path.name)
    return True


def build_drafter(target: Path, out: Path, num_hidden_layers: int, vocab_size: int | None = None) -> Path:
    """Write the first ``num_hidden_layers`` layers of ``target`` into ``out`` (idempotent);
    ``vocab_size`` keeps only the first ids of the embeddings and head (a drafter of another
    vocabulary, which the server must refuse)."""
    from safetensors.torch import load_file, save_file

    recipe = {"target": target.name, "num_hidden_layers": num_hidden_layers, "vocab_size": vocab_size}
    if not start_derived(target, out, out / STAMP, recipe):
        return out
    config = json.loads((target / "config.json").read_text())
    if num_hidden_layers >= config["num_hidden_layers"]:
        raise ValueError(f"num_hidden_layers={num_hidden_layers}: a drafter must have fewer layers than its "
                         f"target's {config['num_hidden_layers']}")
    config["num_hidden_layers"] = num_hidden_layers
    if vocab_size is not None:
        config["vocab_size"] = vocab_size
    for key in ("layer_types",):  # per-layer lists follow the layer count
        if isinstance(config.get(key), list):
            config[key] = config[key][:num_hidden_layers]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = load_file(target / "model.safetensors")
    kept = {name: tensor for name, tensor in weights.items()
            if (m := _LAYER.search(name)) is None or int(m.group(1)) < num_hidden_layers}
    if vocab_size is not None:
        kept = {name: t[:vocab_size].clone() if name.endswith(_VOCAB_ROWS) else t for name, t in kept.items()}
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})
    (out / STAMP).write_text(json.dumps(recipe) + "\n")
    return out
