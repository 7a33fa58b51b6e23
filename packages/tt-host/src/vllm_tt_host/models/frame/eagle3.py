"""EAGLE-3 (``--speculative-config method eagle3``): a one-layer head reading the target's
auxiliary hidden states drafts K tokens per row, run on the mesh beside the model.

Why beside the model, like the MTP module (``frame.mtp``): the head reads the residual stream
entering three of the target's layers at every position (vLLM's
``eagle_aux_hidden_state_layer_ids``), which on a device stays where the step left it; so the
target's steps keep those states per slot (``RetainedHidden``) and ``eagle3_forward`` takes only
token ids and returns draft ids.

The head's math is vLLM's ``llama_eagle3``: ``fc`` joins the three states into one hidden
``h_p``; the layer's attention reads ``[input_layernorm(embed(t_{p+1})), hidden_norm(h_p)]``
(twice the hidden size) with its own paged KV at position ``p``, adds ``h_p`` back as the
residual, then the MLP; ``norm`` and ``lm_head`` over the draft vocabulary predict the token at
``p + 2``, mapped to a target id by ``d2t``. After the first draft the head feeds its own output
hidden (before ``norm``) and its last draft at the next position (EAGLE-3's chaining).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import DecoderWeights, WeightFolder, load_layer_weights
from vllm_tt_host.models.frame.config import DecoderConfig
from vllm_tt_host.models.frame.decoder import DecodeRows, HostDecoder
from vllm_tt_host.models.frame.hidden_drafts import DraftCall, RetainedHidden
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.shapes import HostModelInputError

HEAD_KEY = "--speculative-config model"
UNSERVED_VARIANTS: tuple[str, ...] = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
"""``llama_eagle3`` config switches the host head does not implement (each refused when set)."""


class HeadDecoder(HostDecoder):
    """The head's one layer through the frame's attention: its q/k/v read the token's normed
    embedding beside the normed hidden (``embedded``, set per pass), its residual is the hidden."""

    embedded: torch.Tensor | None = None

    def _qkv(self, h: torch.Tensor, index: int, layer: Any, positions: torch.Tensor) -> Any:
        if self.embedded is None:
            raise HostModelInputError("HeadDecoder: a pass without the token embeddings (set embedded first)")
        return super()._qkv(torch.cat((self.embedded, h), dim=-1), index, layer, positions)


@dataclass(frozen=True)
class Eagle3Head:
    """A loaded EAGLE-3 head and the target layers it reads."""

    decoder: HeadDecoder
    """The layer (its ``input_norm`` is ``hidden_norm``), ``norm`` and ``lm_head`` [draft_vocab, H]."""
    embed: torch.Tensor
    """The head's ``embed_tokens``, else the target's (vLLM shares it when the head ships none)."""
    embed_norm: torch.Tensor
    """``midlayer.input_layernorm``."""
    fc: torch.Tensor
    """``[H, len(aux_layer_ids) * target hidden]``."""
    draft_to_target: torch.Tensor
    """``[draft_vocab]`` long: the target id of each draft id (``arange + d2t``)."""
    aux_layer_ids: tuple[int, ...]

    @property
    def config(self) -> DecoderConfig:
        return self.decoder.config

    def kv_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        return num_blocks, self.config.num_kv_heads, block_size, self.config.head_dim

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, table: torch.Tensor,
             kv_cache: list[LaneKV], rows_per_lane: int) -> torch.Tensor:
        """One token per row through the layer (-1: padding row, no KV write): its output
        hidden before ``norm``."""
        self.decoder.embedded = rms_norm(self.embed[tokens], self.embed_norm, self.config.rms_norm_eps)
        try:
            rows = DecodeRows.of(positions, rows_per_lane)
            return self.decoder.decode_layer(hidden, rows, 0, self.decoder.weights.layers[0], table,
                                             [lane_kv[0] for lane_kv in kv_cache])
        finally:
            self.decoder.embedded = None

    def draft(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target id of the head's greedy draft after each output hidden ``[rows, H]``."""
        return self.draft_to_target[self.decoder._logits(hidden).argmax(-1)]


def load_head(folder: Path, target: DecoderConfig, target_embed: torch.Tensor,
              aux_layer_ids: tuple[int, ...]) -> Eagle3Head:
    """The head in ``folder`` for a target of config ``target``; a head of another hidden
    size or vocabulary, a layer id outside the target, or a variant the host does not run is
    refused naming the setting."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(folder)
    where = f"EAGLE-3 head {folder}"
    if getattr(hf, "num_hidden_layers", None) != 1:
        raise TTConfigError(f"{HEAD_KEY} ({where}): num_hidden_layers", getattr(hf, "num_hidden_layers", None), "1",
                            "serve a one-layer EAGLE-3 head (the yuhuili/EAGLE3-* format vLLM's llama_eagle3 loads)")
    eagle = getattr(hf, "eagle_config", None) or {}
    for name in UNSERVED_VARIANTS:
        if eagle.get(name, getattr(hf, name, False)):
            raise TTConfigError(f"{HEAD_KEY} ({where}): {name}", True, "false",
                                "serve a head trained without it, or use method draft_model / ngram")
    if not all(0 <= i <= target.num_layers for i in aux_layer_ids):
        raise TTConfigError(f"{HEAD_KEY} ({where}): eagle_aux_hidden_state_layer_ids", list(aux_layer_ids),
                            f"layer ids in [0, {target.num_layers}] of the target", "use a head trained for this target")
    config = DecoderConfig.read(hf, "llama")
    reader = WeightFolder(folder)
    layer = load_layer_weights(reader, "midlayer.", config)
    embed = reader.tensor("embed_tokens.weight") if "embed_tokens.weight" in reader else target_embed
    lm_head = reader.tensor("lm_head.weight")
    draft_vocab = int(getattr(hf, "draft_vocab_size", None) or target.vocab_size)
    offsets = reader.tensor("d2t").long() if "d2t" in reader else torch.zeros(draft_vocab, dtype=torch.long)
    fc = reader.tensor("fc.weight")
    target_hidden = int(getattr(hf, "target_hidden_size", None) or config.hidden_size)
    if target_hidden != target.hidden_size:
        raise TTConfigError(f"{HEAD_KEY} ({where}): target_hidden_size", target_hidden,
                            f"the target's hidden size {target.hidden_size}", "serve the EAGLE-3 head trained for this target")
    expected = {
        "fc.weight": (tuple(fc.shape), (config.hidden_size, len(aux_layer_ids) * target.hidden_size)),
        "lm_head.weight": (tuple(lm_head.shape), (draft_vocab, config.hidden_size)),
        "d2t": (tuple(offsets.shape), (draft_vocab,)),
        "embedding": (tuple(embed.shape), (target.vocab_size, config.hidden_size)),
    }
    for name, (got, want) in expected.items():
        if got != want:
            raise TTConfigError(
                f"{HEAD_KEY} ({where}): {name}", got,
                f"{want} for a target of hidden size {target.hidden_size} and vocabulary {target.vocab_size} "
                f"reading {len(aux_layer_ids)} auxiliary hidden states",
                "serve the EAGLE-3 head trained for this target",
            )
    draft_to_target = torch.arange(draft_vocab) + offsets
    if int(draft_to_target.min()) < 0 or int(draft_to_target.max()) >= target.vocab_size:
        raise TTConfigError(f"{HEAD_KEY} ({where}): d2t", "ids outside the target vocabulary",
                            f"draft id + d2t in [0, {target.vocab_size})", "serve the head trained for this target")
    weights = DecoderWeights(embed=embed, layers=(dataclasses.replace(layer, input_norm=reader.tensor(
        "midlayer.hidden_norm.weight")),), norm=reader.tensor("norm.weight"), lm_head=lm_head)
    return Eagle3Head(HeadDecoder(config, weights), embed, layer.input_norm, fc, draft_to_target, tuple(aux_layer_ids))


class Eagle3Serving:
    """The contract's ``supports_eagle3`` calls for a ``HostCausalLM`` whose decoder runs the
    frame's layer stacks (where the auxiliary states are captured)."""

    retained: RetainedHidden | None
    eagle3_head: Eagle3Head | None = None
    eagle3_costs: Any = None
    """The head's programs: one decoder layer of the target's width, ``fc`` and its own head."""

    def allocate_eagle3_kv_cache(self: Any, head_dir: str, aux_layer_ids: tuple[int, ...],
                                 kv_cache_shape: tuple[int, ...], dtype: Any) -> list[LaneKV]:
        """Load the head, give it its paged KV (one page per target block) and keep the target's
        auxiliary hidden states from now on."""
        if self.synthetic is not None:
            raise TTConfigError("--speculative-config method", "eagle3", "served with model math",
                                "leave tt.host_skip_math off")
        ids = tuple(int(i) for i in aux_layer_ids)
        head = load_head(Path(head_dir), self.config, self.decoder.weights.embed, ids)
        num_blocks, _heads, block_size, head_dim = (int(v) for v in kv_cache_shape)
        if head_dim != head.config.head_dim:
            raise HostModelInputError(f"allocate_eagle3_kv_cache: head_dim {head_dim}, the head has "
                                      f"{head.config.head_dim}")
        self.eagle3_head = head
        self.eagle3_costs = None if self.costs is None else self.costs.eagle3_head(len(head.draft_to_target), len(ids))
        self.retained = RetainedHidden()
        self.decoder.keep_hidden = True
        self.decoder.aux_layers = ids
        return [[self.layer_storage(head.kv_shape(num_blocks, block_size))] for _ in range(self.lanes.count)]

    def eagle3_forward(self: Any, tokens: Any, start_pos: Any, num_valid_tokens: Any, page_table: Any,
                       kv_cache: Any, num_drafts: int, **kwargs: Any) -> torch.Tensor:
        """``[B, num_drafts]`` int64 chained draft ids (target ids; -1: no draft)."""
        head = self.eagle3_head
        if head is None:
            raise HostModelInputError("eagle3_forward before allocate_eagle3_kv_cache: no head is loaded")
        call = DraftCall.check(self, "eagle3_forward", tokens, start_pos, num_valid_tokens, page_table, kv_cache,
                               num_drafts)
        duration = call.duration_s(self, self.eagle3_costs) if self.eagle3_costs is not None else 0.0
        return self.queue.submit(functools.partial(_eagle3_program, self, head, call, kv_cache), duration).result()


def _eagle3_program(model: Any, head: Eagle3Head, call: DraftCall, kv_cache: list[LaneKV]) -> torch.Tensor:
    aux, first, valid = call.kept_hidden(model.retained, head.fc.shape[1])
    hidden = F.linear(aux, head.fc)
    rows, rows_per_lane = call.tokens.shape[0], model.lanes.rows_per_lane
    out = torch.zeros(rows, head.config.hidden_size)
    for j in range(int(valid.max()) if valid.numel() else 0):  # catch-up: one position per pass
        positions = torch.where((valid > j) & (first <= j), call.start + j, -1)
        h = head.step(call.tokens[:, j], positions, hidden[:, j], call.table, kv_cache, rows_per_lane)
        done = valid == j + 1
        out[done] = h[done]
    drafts = torch.full((rows, call.num_drafts), -1, dtype=torch.long)
    live = valid > 0
    for k in range(call.num_drafts):
        drafts[live, k] = head.draft(out[live])
        if k + 1 < call.num_drafts:  # the next draft reads this one and the head's own hidden
            positions = torch.where(live, call.start + valid + k, -1)
            out = head.step(drafts[:, k].clamp(min=0), positions, out, call.table, kv_cache, rows_per_lane)
    return drafts
