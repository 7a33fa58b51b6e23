"""A DeepSeek V3 checkpoint with an MTP module, for ``--speculative-config method mtp`` tests.

transformers has no MTP module (it drops ``model.layers.{num_hidden_layers}.*`` on load), so
this adds one to the trained tiny DeepSeek V3 under vLLM's ``deepseek_mtp`` names and sets
``num_nextn_predict_layers: 1``. The module is trained briefly with the target frozen: at
position ``p`` it reads the target's final hidden state and the embedding of token ``p + 1``
and predicts token ``p + 2``, so its drafts are accepted often enough (and rejected often
enough) for the tests. Its decoder block is trained as the one layer of a transformers
DeepSeek V3 fed ``eh_proj``'s output as input embeddings; that model's final norm and head are
the module's ``shared_head``.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

STAMP = ".vllm-tt-mtp.json"
TRAIN_SEQ_LEN = 48
TRAIN_BATCH = 16
TRAIN_LR = 3e-3


class MtpHead:
    """The MTP module in transformers' modules: ``enorm``, ``hnorm``, ``eh_proj`` and a one-layer
    model (block, ``shared_head.norm``, ``shared_head.head``)."""

    def __init__(self, target: Any, index: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        config.first_k_dense_replace = 1 if index < (target.config.first_k_dense_replace or 0) else 0
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.block = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        self.block.lm_head.weight.data.copy_(target.lm_head.weight.data)
        self.embed = target.model.embed_tokens.weight.detach()
        self.enorm = torch.nn.Parameter(torch.ones(hidden))
        self.hnorm = torch.nn.Parameter(torch.ones(hidden))
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)

    @classmethod
    def from_checkpoint(cls, folder: Path, scratch: Path) -> tuple[Any, MtpHead]:
        """transformers' target model of an MTP checkpoint and its MTP module read back from
        the saved tensors (the oracle of the host's MTP math): the block through a one-layer
        model written to ``scratch``."""
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        index = target.config.num_hidden_layers
        head = cls(target, index)
        p = f"model.layers.{index}."
        saved = load_file(folder / "model.safetensors")
        head.block.save_pretrained(scratch)
        block = {"model.embed_tokens.weight": saved["model.embed_tokens.weight"],
                 "model.norm.weight": saved[p + "shared_head.norm.weight"],
                 "lm_head.weight": saved[p + "shared_head.head.weight"]}
        block |= {"model.layers.0." + n.removeprefix(p): t for n, t in saved.items()
                  if n.startswith(p) and not n.startswith((p + "shared_head.", p + "enorm", p + "hnorm", p + "eh_proj"))}
        save_file(block, scratch / "model.safetensors", metadata={"format": "pt"})
        head.block = AutoModelForCausalLM.from_pretrained(scratch, dtype=torch.float32).eval()
        head.enorm.data.copy_(saved[p + "enorm.weight"])
        head.hnorm.data.copy_(saved[p + "hnorm.weight"])
        head.eh_proj.weight.data.copy_(saved[p + "eh_proj.weight"])
        return target, head

    def parameters(self) -> list[Any]:
        return [*self.block.parameters(), self.enorm, self.hnorm, *self.eh_proj.parameters()]

    def logits(self, next_ids: Any, hidden: Any) -> Any:
        """``next_ids [B, T]`` (tokens at positions ``1..T``), ``hidden [B, T, H]`` (the
        target's at ``0..T-1``): logits ``[B, T, V]`` for the tokens at ``2..T+1``."""
        import torch

        embedded = self.embed[next_ids]
        embedded[:, 0] = 0.0  # position 0 reads no embedding (vLLM's deepseek_mtp)
        joined = torch.cat((self._norm(embedded, self.enorm), self._norm(hidden, self.hnorm)), dim=-1)
        return self.block(inputs_embeds=self.eh_proj(joined)).logits

    def _norm(self, x: Any, weight: Any) -> Any:
        import torch

        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def state_dict(self, index: int, scratch: Path) -> dict[str, Any]:
        """The module under vLLM's ``deepseek_mtp`` names (``model.layers.{index}.*``); the
        block's tensors as transformers writes them (``save_pretrained``: experts one by one)."""
        from safetensors.torch import load_file

        p = f"model.layers.{index}."
        self.block.save_pretrained(scratch)
        saved = load_file(scratch / "model.safetensors")
        out = {p + "enorm.weight": self.enorm.data, p + "hnorm.weight": self.hnorm.data,
               p + "eh_proj.weight": self.eh_proj.weight.data,
               p + "shared_head.norm.weight": saved["model.norm.weight"],
               p + "shared_head.head.weight": saved["lm_head.weight"]}
        for name, tensor in saved.items():
            if name.startswith("model.layers.0."):
                out[p + name.removeprefix("model.layers.0.")] = tensor
        return {name: t.detach().clone().contiguous() for name, t in out.items()}


def build_mtp_checkpoint(target: Path, out: Path, train_steps: int, seed: int = 0) -> Path:
    """``target`` plus a trained MTP module in ``out`` (idempotent)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    from vllm_tt_host.tiny import EOS, build_tokenizer, corpus_text

    recipe = {"target": target.name, "train_steps": train_steps, "seed": seed}
    stamp = out / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        return out
    out.mkdir(parents=True, exist_ok=True)
    for path in target.iterdir():
        if path.is_file() and path.name not in ("model.safetensors", "config.json") and not path.name.startswith("."):
            shutil.copy2(path, out / path.name)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    index = model.config.num_hidden_layers
    tokenizer = build_tokenizer()
    ids: list[int] = []
    for paragraph in (p.strip() for p in corpus_text().split("\n\n") if p.strip()):
        ids += [*tokenizer.encode(paragraph).ids, tokenizer.token_to_id(EOS)]
    stream = torch.tensor(ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = MtpHead(model, index)
        _train(model, head, stream, train_steps, seed)
    with tempfile.TemporaryDirectory() as scratch:
        weights = load_file(target / "model.safetensors") | head.state_dict(index, Path(scratch))
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    stamp.write_text(json.dumps(recipe) + "\n")
    return out


def _train(model: Any, head: MtpHead, stream: Any, steps: int, seed: int) -> None:
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=TRAIN_LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / steps)))
    head.block.train()
    span = len(stream) - TRAIN_SEQ_LEN - 2
    for _ in range(steps):
        starts = torch.randint(0, span, (TRAIN_BATCH,), generator=generator)
        window = torch.stack([stream[s : s + TRAIN_SEQ_LEN + 2] for s in starts.tolist()])
        with torch.no_grad():
            hidden = model.model(window[:, :TRAIN_SEQ_LEN]).last_hidden_state
        logits = head.logits(window[:, 1 : TRAIN_SEQ_LEN + 1], hidden)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 2 : TRAIN_SEQ_LEN + 2].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    head.block.eval()
