"""Checkpoints with an MTP module, for ``--speculative-config method mtp`` tests: the tiny
DeepSeek V3 (vLLM's ``deepseek_mtp`` names, ``num_nextn_predict_layers: 1``) and the tiny
Qwen 3.5 (``qwen3_5_mtp``: ``mtp.*``, ``mtp_num_hidden_layers: 1``).

transformers has no MTP module (it drops those weights on load), so this adds one to a trained
tiny target under vLLM's names. The module is trained briefly with the target frozen: at
position ``p`` it reads the target's final hidden state and the embedding of token ``p + 1``
and predicts token ``p + 2``, so its drafts are accepted often enough (and rejected often
enough) for the tests. Its decoder block is trained as the one layer of a transformers model of
the target's family fed the projection's output as input embeddings; that model's final norm
(and, for DeepSeek, its head: ``shared_head``) is the module's. Qwen 3.5's module predicts
through the target's own LM head (kept frozen) and reads the embedding at position 0 too; its
norms scale by ``1 + w``.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_tt_testing.tiny_drafter import start_derived

STAMP = ".vllm-tt-mtp.json"
TRAIN_SEQ_LEN = 48
TRAIN_BATCH = 16
TRAIN_LR = 3e-3


@dataclass(frozen=True)
class MtpNames:
    """Where a family keeps its MTP module's tensors, and how it wires them."""

    count_field: str
    """The config field declaring the module (vLLM's ``n_predict``)."""
    prefix: str
    """``{index}`` stands for the target's layer count."""
    enorm: str
    hnorm: str
    proj: str
    norm: str
    block: str
    """Under ``prefix``: the decoder block's tensors (DeepSeek: beside the module's own)."""
    own_head: str | None
    """The module's own LM head (DeepSeek's ``shared_head.head``); None: the target's, frozen."""
    norm_offset: float
    """RMSNorm scale ``offset + w`` (Qwen 3.5: 1)."""
    zero_first_embedding: bool

    def at(self, index: int) -> str:
        return self.prefix.format(index=index)


FAMILIES = {
    "deepseek_v3": MtpNames("num_nextn_predict_layers", "model.layers.{index}.", "enorm.weight", "hnorm.weight",
                            "eh_proj.weight", "shared_head.norm.weight", "", "shared_head.head.weight", 0.0, True),
    "qwen3_5_text": MtpNames("mtp_num_hidden_layers", "mtp.", "pre_fc_norm_embedding.weight",
                             "pre_fc_norm_hidden.weight", "fc.weight", "norm.weight", "layers.0.", None, 1.0, False),
}
"""By ``model_type``."""


class MtpHead:
    """The MTP module in transformers' modules: ``enorm``, ``hnorm``, ``eh_proj`` and a one-layer
    model (block, final norm, head)."""

    def __init__(self, target: Any, index: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.names = FAMILIES[target.config.model_type]
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        if self.names.own_head is not None:  # DeepSeek: the module's block is dense or routed as layer `index`
            config.first_k_dense_replace = 1 if index < (target.config.first_k_dense_replace or 0) else 0
        if getattr(config, "layer_types", None):  # Qwen 3.5: one full-attention layer
            config.layer_types = ["full_attention"]
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.block = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        self.block.lm_head.weight.data.copy_(target.lm_head.weight.data)
        if self.names.own_head is None:
            self.block.lm_head.weight.requires_grad_(False)
        self.embed = target.model.embed_tokens.weight.detach()
        start = 1.0 - self.names.norm_offset
        self.enorm = torch.nn.Parameter(torch.full((hidden,), start))
        self.hnorm = torch.nn.Parameter(torch.full((hidden,), start))
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
        names = head.names
        p = names.at(index)
        saved = load_file(folder / "model.safetensors")
        head.block.save_pretrained(scratch)
        block = {"model.embed_tokens.weight": saved["model.embed_tokens.weight"],
                 "model.norm.weight": saved[p + names.norm],
                 "lm_head.weight": saved[p + names.own_head] if names.own_head else saved["lm_head.weight"]}
        own = tuple(p + n for n in (names.norm, names.enorm, names.hnorm, names.proj, names.own_head or names.norm))
        block |= {"model.layers.0." + n.removeprefix(p + names.block): t for n, t in saved.items()
                  if n.startswith(p + names.block) and not n.startswith((*own, p + "shared_head."))}
        save_file(block, scratch / "model.safetensors", metadata={"format": "pt"})
        head.block = AutoModelForCausalLM.from_pretrained(scratch, dtype=torch.float32).eval()
        head.enorm.data.copy_(saved[p + names.enorm])
        head.hnorm.data.copy_(saved[p + names.hnorm])
        head.eh_proj.weight.data.copy_(saved[p + names.proj])
        return target, head

    def parameters(self) -> list[Any]:
        return [p for p in (*self.block.parameters(), self.enorm, self.hnorm, *self.eh_proj.parameters())
                if p.requires_grad]

    def logits(self, next_ids: Any, hidden: Any) -> Any:
        """``next_ids [B, T]`` (tokens at positions ``1..T``), ``hidden [B, T, H]`` (the
        target's at ``0..T-1``): logits ``[B, T, V]`` for the tokens at ``2..T+1``."""
        return self.block(inputs_embeds=self._joined(next_ids, hidden)).logits

    def greedy_drafts(self, target: Any, prompt: list[int], fed: list[int], num_drafts: int) -> list[int]:
        """What the module drafts after ``prompt`` (``fed``: its tokens from position 1 on and
        the target's next token): the first from the target's hidden states, each further one
        from the module's own output hidden (before its norm) and its last draft, one position
        on (vLLM's chained MTP steps)."""
        import torch

        with torch.no_grad():
            hidden = target.model(torch.tensor([prompt])).last_hidden_state
            ids, drafts = list(fed), []
            for _ in range(num_drafts):
                drafts.append(int(self.logits(torch.tensor([ids]), hidden)[0, -1].argmax()))
                hidden = torch.cat((hidden, self._block_output(torch.tensor([ids]), hidden)[:, -1:]), dim=1)
                ids.append(drafts[-1])
        return drafts

    def _block_output(self, next_ids: Any, hidden: Any) -> Any:
        """The block's output before the module's norm (transformers reports only the normed one)."""
        outputs: list[Any] = []
        hook = self.block.model.layers[0].register_forward_hook(
            lambda _m, _i, o: outputs.append(o[0] if isinstance(o, tuple) else o))
        self.block.model(inputs_embeds=self._joined(next_ids, hidden))
        hook.remove()
        return outputs[0]

    def _joined(self, next_ids: Any, hidden: Any) -> Any:
        """The block's input: the projection over the normed embeddings and hidden states."""
        import torch

        embedded = self.embed[next_ids]
        if self.names.zero_first_embedding:
            embedded[:, 0] = 0.0  # position 0 reads no embedding (vLLM's deepseek_mtp)
        return self.eh_proj(torch.cat((self._norm(embedded, self.enorm), self._norm(hidden, self.hnorm)), dim=-1))

    def _norm(self, x: Any, weight: Any) -> Any:
        import torch

        return (self.names.norm_offset + weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def state_dict(self, index: int, scratch: Path) -> dict[str, Any]:
        """The module under vLLM's names; the block's tensors as transformers writes them
        (``save_pretrained``: experts one by one)."""
        from safetensors.torch import load_file

        names = self.names
        p = names.at(index)
        self.block.save_pretrained(scratch)
        saved = load_file(scratch / "model.safetensors")
        out = {p + names.enorm: self.enorm.data, p + names.hnorm: self.hnorm.data,
               p + names.proj: self.eh_proj.weight.data, p + names.norm: saved["model.norm.weight"]}
        if names.own_head is not None:
            out[p + names.own_head] = saved["lm_head.weight"]
        for name, tensor in saved.items():
            if name.startswith("model.layers.0."):
                out[p + names.block + name.removeprefix("model.layers.0.")] = tensor
        return {name: t.detach().clone().contiguous() for name, t in out.items()}


QWEN3_5_TARGET_STEPS = 100
"""The tiny Qwen 3.5 the Qwen MTP checkpoint extends (the Qwen 3.5 tests' recipe)."""


def cached_qwen3_5_mtp(train_steps: int = 150) -> Path:
    """The trained tiny Qwen 3.5 with a trained ``mtp.*`` module, built once into the
    machine-wide cache (keyed by this module's source; ``checkpoints.cached_mtp`` is DeepSeek's)."""
    from vllm_tt_testing.checkpoints import cached, cached_tiny

    target = cached_tiny("qwen3_5", QWEN3_5_TARGET_STEPS)
    return cached(f"mtp-qwen3_5-{train_steps}", lambda out: build_mtp_checkpoint(target, out, train_steps),
                  target.name, train_steps)


def build_mtp_checkpoint(target: Path, out: Path, train_steps: int, seed: int = 0) -> Path:
    """``target`` plus a trained MTP module in ``out`` (idempotent)."""
    import torch
    import vllm_tt_host.tiny as tiny
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    recipe = {"target": target.name, "train_steps": train_steps, "seed": seed}
    stamp = out / STAMP
    if not start_derived(target, out, stamp, recipe):
        return out
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    index = model.config.num_hidden_layers
    stream = tiny._corpus_ids(tiny.build_tokenizer())
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = MtpHead(model, index)
        _train(model, head, stream, train_steps, seed)
    with tempfile.TemporaryDirectory() as scratch:
        weights = load_file(target / "model.safetensors") | head.state_dict(index, Path(scratch))
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config[head.names.count_field] = 1
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
