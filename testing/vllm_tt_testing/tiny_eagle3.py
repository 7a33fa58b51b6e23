"""A tiny EAGLE-3 head for the trained tiny Llama, for ``--speculative-config method eagle3`` tests.

The format is the one vLLM 0.33's ``llama_eagle3.py`` loads (the ``yuhuili/EAGLE3-*`` layout):
``config.json`` a Llama config with ``architectures: [LlamaForCausalLMEagle3]``, one hidden
layer, ``draft_vocab_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``; tensors
``fc.weight`` (over the target's three auxiliary hidden states), ``midlayer.*`` (one decoder
layer whose q/k/v read ``[input_layernorm(embed(token)), hidden_norm(hidden)]``, twice the
hidden size), ``norm.weight``, ``lm_head.weight`` over the draft vocabulary and ``d2t`` (draft
id -> target id offset) / ``t2d`` (target ids in the draft vocabulary). No ``embed_tokens``:
the head shares the target's embedding, as vLLM does when a head ships none.

The target's auxiliary hidden state of layer id ``L`` is vLLM's: the residual stream entering
decoder layer ``L`` (id 0 the embeddings, id ``num_hidden_layers`` the last layer's output
before the final norm). The tiny target has two layers, so the ids are ``[0, 1, 2]``.

``Eagle3Head`` is the head in plain torch (transformers' norms, rotary embedding and MLP): the
trainer, and the oracle the host model's drafts are checked against. Training is EAGLE-3's
"training-time test": step 1 reads ``fc`` of the target's auxiliary states; step ``s > 1``
reads the head's own output hidden (before its final norm) one position later, attending to
step 1's keys up to the position it continues from and to its own chain, as serving does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vllm_tt_testing.tiny_drafter import start_derived

STAMP = ".vllm-tt-eagle3.json"
AUX_LAYER_IDS = (0, 1, 2)
DRAFT_VOCAB = 512
TRAIN_SEQ_LEN = 48
TRAIN_BATCH = 16
TRAIN_LR = 3e-3
TRAIN_CHAIN = 3
"""Training-time-test steps: the head learns its first three chained drafts."""


def aux_hidden_states(target: Any, ids: Any, layer_ids: tuple[int, ...] = AUX_LAYER_IDS) -> Any:
    """transformers' target over ``ids [B, T]``: ``[B, T, len(layer_ids) * hidden]``, the
    residual stream entering each named layer (the last layer's output for ``num_hidden_layers``),
    read with forward hooks (its ``output_hidden_states`` ends after the final norm)."""
    import torch

    layers = target.model.layers
    seen: dict[int, Any] = {}
    hooks = [layer.register_forward_pre_hook(
        lambda _m, args, kwargs, i=i: seen.__setitem__(i, (kwargs.get("hidden_states", args[0] if args else None))),
        with_kwargs=True) for i, layer in enumerate(layers)]
    hooks.append(layers[-1].register_forward_hook(
        lambda _m, _a, out: seen.__setitem__(len(layers), out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            target.model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([seen[i] for i in layer_ids], dim=-1)


class Eagle3Head:
    """The EAGLE-3 head's math over whole sequences (a torch module tree under ``modules``)."""

    def __init__(self, config: Any, embed: Any, draft_ids: Any) -> None:
        import torch
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or hidden // heads
        eps = config.rms_norm_eps
        self.embed = embed
        self.draft_ids = draft_ids
        """``[draft_vocab]``: the target id of each draft id."""
        m = torch.nn.ModuleDict({
            "fc": torch.nn.Linear(len(AUX_LAYER_IDS) * hidden, hidden, bias=False),
            "input_layernorm": LlamaRMSNorm(hidden, eps), "hidden_norm": LlamaRMSNorm(hidden, eps),
            "q_proj": torch.nn.Linear(2 * hidden, heads * self.head_dim, bias=False),
            "k_proj": torch.nn.Linear(2 * hidden, kv_heads * self.head_dim, bias=False),
            "v_proj": torch.nn.Linear(2 * hidden, kv_heads * self.head_dim, bias=False),
            "o_proj": torch.nn.Linear(heads * self.head_dim, hidden, bias=False),
            "post_attention_layernorm": LlamaRMSNorm(hidden, eps), "mlp": LlamaMLP(config),
            "norm": LlamaRMSNorm(hidden, eps),
            "lm_head": torch.nn.Linear(hidden, len(draft_ids), bias=False),
        })
        self.modules = m
        self.rotary = LlamaRotaryEmbedding(config)

    @classmethod
    def from_checkpoint(cls, folder: Path, target: Any) -> Eagle3Head:
        """The head saved in ``folder``, over ``target``'s embedding (transformers' model)."""
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaConfig

        saved = load_file(folder / "model.safetensors")
        draft_ids = torch.arange(saved["d2t"].shape[0]) + saved["d2t"]
        head = cls(LlamaConfig.from_pretrained(folder), target.model.embed_tokens.weight.detach(), draft_ids)
        head.modules.load_state_dict({_MODULE_OF.get(n, n): t for n, t in saved.items() if n not in ("d2t", "t2d")})
        head.modules.eval()
        return head

    def step(self, ids: Any, hidden: Any, positions: Any, prior: list[tuple[Any, Any]], mask: Any) -> tuple[Any, Any, Any]:
        """One pass of the layer over ``ids [B, T]`` with ``hidden [B, T, H]`` at ``positions
        [T]``; keys are ``prior`` passes' ``(k, v)`` then this pass's, ``mask [T, keys]``
        (True: visible). Returns (draft logits ``[B, T, draft_vocab]``, the output hidden before
        the final norm ``[B, T, H]``, this pass's ``(k, v)``)."""
        import torch
        import torch.nn.functional as F
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        m, cfg = self.modules, self.config
        batch, length, _ = hidden.shape
        x = torch.cat((m["input_layernorm"](self.embed[ids]), m["hidden_norm"](hidden)), dim=-1)
        q = m["q_proj"](x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        k = m["k_proj"](x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        v = m["v_proj"](x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(hidden, positions[None].expand(batch, -1))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys = torch.cat([pk for pk, _ in prior] + [k], dim=2)
        values = torch.cat([pv for _, pv in prior] + [v], dim=2)
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        out = F.scaled_dot_product_attention(q, keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1),
                                             attn_mask=mask[None, None], scale=self.head_dim**-0.5)
        residual = hidden + m["o_proj"](out.transpose(1, 2).reshape(batch, length, -1))
        residual = residual + m["mlp"](m["post_attention_layernorm"](residual))
        return m["lm_head"](m["norm"](residual)), residual, (k, v)

    def chain(self, next_ids: Any, aux: Any, steps: int) -> list[Any]:
        """EAGLE-3's chained drafts over a sequence: ``next_ids [B, T + steps - 1]`` are the
        tokens at positions ``1 ..`` (what each step feeds), ``aux [B, T, 3H]`` the target's at
        ``0 .. T-1``. Entry ``s`` of the result is step ``s + 1``'s draft logits ``[B, T,
        draft_vocab]``: at row position ``p`` the guess for the token at ``p + 2 + s``, from the
        target's hidden at ``p`` and the head's own hidden for the ``s`` positions after it."""
        import torch

        length = aux.shape[1]
        pos = torch.arange(length)
        causal = pos[None, :] <= pos[:, None]
        own = torch.eye(length, dtype=torch.bool)
        hidden = self.modules["fc"](aux)
        prior: list[tuple[Any, Any]] = []
        out: list[Any] = []
        for s in range(steps):
            mask = torch.cat([causal] + [own] * s, dim=1)
            logits, hidden, kv = self.step(next_ids[:, s : s + length], hidden, pos + s, prior, mask)
            prior.append(kv)
            out.append(logits)
        return out

    def parameters(self) -> Any:
        return self.modules.parameters()

    def state_dict(self, vocab_size: int) -> dict[str, Any]:
        """The head under the EAGLE-3 checkpoint's names, with ``d2t`` and ``t2d``."""
        import torch

        names = {module: name for name, module in _MODULE_OF.items()}
        out = {names.get(n, n): t.detach().clone().contiguous() for n, t in self.modules.state_dict().items()}
        draft = torch.arange(len(self.draft_ids))
        out["d2t"] = (self.draft_ids - draft).long()
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[self.draft_ids] = True
        out["t2d"] = t2d
        return out


_MODULE_OF = {
    "fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight",
    "midlayer.input_layernorm.weight": "input_layernorm.weight", "midlayer.hidden_norm.weight": "hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight": "post_attention_layernorm.weight",
    **{f"midlayer.self_attn.{p}.weight": f"{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{f"midlayer.mlp.{p}.weight": f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")},
}
"""Checkpoint tensor name -> ``Eagle3Head.modules`` name."""


def build_eagle3_head(target: Path, out: Path, train_steps: int, seed: int = 0) -> Path:
    """A trained EAGLE-3 head for ``target`` (the tiny Llama) in ``out`` (idempotent)."""
    import torch
    import vllm_tt_host.tiny as tiny
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    recipe = {"target": target.name, "train_steps": train_steps, "seed": seed}
    stamp = out / STAMP
    if not start_derived(target, out, stamp, recipe):
        return out
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    stream = tiny._corpus_ids(tiny.build_tokenizer())
    # The draft vocabulary: the corpus's most frequent tokens (EAGLE-3 keeps the frequent ids).
    counts = torch.bincount(stream, minlength=model.config.vocab_size)
    draft_ids = counts.topk(DRAFT_VOCAB).indices.sort().values
    config = json.loads((target / "config.json").read_text())
    config |= {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": DRAFT_VOCAB,
               "tie_word_embeddings": False,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS), "use_aux_hidden_state": True}}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = Eagle3Head(LlamaConfig.from_pretrained(out), model.model.embed_tokens.weight.detach(), draft_ids)
        _train(model, head, stream, train_steps, seed)
    save_file(head.state_dict(model.config.vocab_size), out / "model.safetensors", metadata={"format": "pt"})
    stamp.write_text(json.dumps(recipe) + "\n")
    return out


def _train(model: Any, head: Eagle3Head, stream: Any, steps: int, seed: int) -> None:
    import torch
    import torch.nn.functional as F

    to_draft = torch.full((model.config.vocab_size,), -100, dtype=torch.long)
    to_draft[head.draft_ids] = torch.arange(len(head.draft_ids))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=TRAIN_LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / steps)))
    head.modules.train()
    width = TRAIN_SEQ_LEN + TRAIN_CHAIN + 1
    span = len(stream) - width
    for _ in range(steps):
        starts = torch.randint(0, span, (TRAIN_BATCH,), generator=generator)
        window = torch.stack([stream[s : s + width] for s in starts.tolist()])
        aux = aux_hidden_states(model, window[:, :TRAIN_SEQ_LEN])
        logits = head.chain(window[:, 1 : TRAIN_SEQ_LEN + TRAIN_CHAIN], aux, TRAIN_CHAIN)
        loss: Any = sum(F.cross_entropy(step.reshape(-1, step.shape[-1]),
                                        to_draft[window[:, 2 + s : 2 + s + TRAIN_SEQ_LEN]].reshape(-1), ignore_index=-100)
                        for s, step in enumerate(logits))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    head.modules.eval()
