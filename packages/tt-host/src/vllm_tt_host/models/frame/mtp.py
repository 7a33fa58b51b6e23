"""Multi-token prediction (``--speculative-config method mtp``): the checkpoint's MTP module
runs on the mesh as part of the model and drafts K tokens per row after each step.

Why inside the model: an MTP module reads the target's final hidden state at every position,
which on a device stays in DRAM where the step left it (tt-metal's DeepSeek V3 keeps it there;
reading ``[B, 1 + K, hidden]`` back each step only to send it again would cost a round trip per
step). So the target's steps keep their hidden states per slot (``RetainedHidden``) and
``mtp_forward`` takes only token ids and returns draft ids: the handoff never leaves the mesh.

The module (DeepSeek V3's ``model.layers.{num_hidden_layers}``, Qwen 3.5's ``mtp.*``) at
position ``p`` reads the target's hidden ``h_p`` (after the final norm) and the embedding of the
token at ``p + 1``, RMS-normed apart (``hnorm``, ``enorm``; DeepSeek's embedding zeroed at
position 0, as vLLM's ``deepseek_mtp`` does), joined by ``eh_proj`` and passed through one
decoder block of the family's (its ``decode_layer``) with its own paged KV; its output, through
its norm and head, predicts the token at ``p + 2``. A
row's first draft comes from the positions the target verified since the last call (their MTP
KV is rewritten from the true hidden states); each further draft feeds the module its own
output hidden and its last draft at the next position (vLLM's chained MTP steps).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from vllm_tt_host.models.frame.decoder import DecodeRows
from vllm_tt_host.models.frame.inputs import check_decode, check_kv
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.shapes import HostModelInputError

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.generator import HostCausalLM


@dataclass(frozen=True)
class MtpModule:
    """One MTP module's weights: vLLM's ``deepseek_mtp`` (``model.layers.{index}``) or
    ``qwen3_5_mtp`` (``mtp.*``: ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``,
    ``layers.0``, ``norm``, with the target's LM head)."""

    index: int
    """Its decoder block's layer index (``num_hidden_layers``: it follows the last layer)."""
    embed: torch.Tensor
    enorm: torch.Tensor
    hnorm: torch.Tensor
    eh_proj: torch.Tensor
    """``[hidden, 2 * hidden]``: over ``[enorm(embedding), hnorm(hidden)]``."""
    block: Any
    """The family's decoder layer (its ``HostDecoder.decode_layer`` runs it)."""
    norm: torch.Tensor
    """``shared_head.norm`` (Qwen 3.5: ``mtp.norm``)."""
    head: torch.Tensor
    """``shared_head.head`` ``[V, hidden]`` (Qwen 3.5: the target's ``lm_head``)."""
    embeds_position_zero: bool = False
    """Whether position 0 reads its token's embedding (Qwen 3.5) or zeros (vLLM's
    ``deepseek_mtp``)."""


class RetainedHidden:
    """The target's final hidden states per slot, from the positions its steps computed and
    its MTP module has not read yet (device memory on hardware)."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[int, torch.Tensor]] = {}

    def prefilled(self, slot: int, start: int, hidden: torch.Tensor) -> None:
        """A prefill (chunk): the next chunk of the row in the slot, else a new row."""
        first, kept = self._rows.get(slot, (start, hidden[:0]))
        if first + kept.shape[0] != start:
            first, kept = start, hidden[:0]
        self._rows[slot] = (first, torch.cat((kept, hidden)))

    def decoded(self, slot: int, position: int, hidden: torch.Tensor) -> None:
        """A decode or verify position: it replaces what the slot kept from ``position`` on
        (positions whose drafts were rejected are computed again)."""
        first, kept = self._rows.get(slot, (position, hidden[:0]))
        if not first <= position <= first + kept.shape[0]:
            first, kept = position, hidden[:0]
        self._rows[slot] = (first, torch.cat((kept[: position - first], hidden[None])))

    def take(self, slot: int, start: int, count: int) -> tuple[int, torch.Tensor]:
        """The kept hidden states of positions ``[start, start + count)`` from the first one
        kept (``(offset, [m, hidden])``: ``m`` may be short of ``count - offset`` when a row's
        prefix came from the prefix cache); the slot keeps only what follows them."""
        first, kept = self._rows.get(slot, (start, torch.zeros(0)))
        lo, hi = max(start, first), start + count
        taken = kept[lo - first : max(hi - first, 0)]
        self._rows[slot] = (max(hi, first), kept[max(hi - first, 0) :])
        return lo - start, taken


def mtp_forward(
    model: HostCausalLM, tokens: Any, start_pos: Any, num_valid_tokens: Any, page_table: Any, kv_cache: Any,
    num_drafts: int,
) -> torch.Tensor:
    """``[B, num_drafts]`` int64 draft ids (-1: no draft). Row ``r``'s ``tokens[r, :n]`` (``n =
    num_valid_tokens[r]``, 0: padding) are the tokens at positions ``start_pos[r] + 1 ..
    start_pos[r] + n``, each read with the target's hidden state one position before it."""
    module = model.decoder.mtp
    if module is None:
        raise HostModelInputError(f"{type(model).__name__}: the checkpoint has no MTP module")
    tokens = torch.as_tensor(tokens).long()
    start = torch.as_tensor(start_pos).reshape(-1).long()
    valid = torch.as_tensor(num_valid_tokens).reshape(-1).long()
    if tokens.dim() != 2 or valid.shape != start.shape or tokens.shape[0] != start.shape[0]:
        raise HostModelInputError(
            f"mtp_forward takes tokens [rows, W] with one start_pos and num_valid_tokens per row; got "
            f"{tuple(tokens.shape)}, {tuple(start.shape)}, {tuple(valid.shape)}"
        )
    if num_drafts < 1 or bool((valid < 0).any()) or bool((valid > tokens.shape[1]).any()):
        raise HostModelInputError(f"mtp_forward: num_drafts {num_drafts} < 1 or num_valid_tokens "
                                  f"{valid.tolist()} outside [0, {tokens.shape[1]}]")
    check_kv(kv_cache, model.lanes)
    table = torch.as_tensor(page_table)
    last = torch.where(valid > 0, start + valid - 1 + num_drafts - 1, -1)
    check_decode(tokens[:, 0], last, [table], kv_cache, model.lanes, model.max_seq_len)
    duration = 0.0
    if model.mtp_costs is not None:  # the catch-up as one verify-shaped pass, then one pass per draft
        live = torch.where(valid > 0, start, -1)
        duration = model.lanes.verify_s(model.mtp_costs, live, valid)
        duration += (num_drafts - 1) * model.lanes.decode_s(model.mtp_costs, last)
    program = functools.partial(_mtp_program, model, module, tokens, start, valid, table, kv_cache, num_drafts)
    return model.queue.submit(program, duration).result()


def _mtp_program(
    model: HostCausalLM, module: MtpModule, tokens: torch.Tensor, start: torch.Tensor, valid: torch.Tensor,
    table: torch.Tensor, kv_cache: list[LaneKV], num_drafts: int,
) -> torch.Tensor:
    retained = model.retained
    if retained is None:
        raise HostModelInputError("mtp_forward before allocate_mtp_kv_cache: no hidden states were kept")
    rows, hidden_size = tokens.shape[0], model.config.hidden_size
    valid = valid.clone()  # rows without kept hidden states draft nothing
    hidden = torch.zeros(rows, tokens.shape[1], hidden_size)
    first = torch.zeros(rows, dtype=torch.long)
    for r in (valid > 0).nonzero().flatten().tolist():
        offset, kept = retained.take(r, int(start[r]), int(valid[r]))
        if kept.shape[0] < int(valid[r]) - offset:  # the target never computed them: no drafts
            valid[r] = 0
            continue
        hidden[r, offset : offset + kept.shape[0]] = kept
        first[r] = offset
    drafts = torch.full((rows, num_drafts), -1, dtype=torch.long)
    out = torch.zeros(rows, hidden_size)
    for j in range(int(valid.max()) if valid.numel() else 0):  # catch-up: one position per pass
        positions = torch.where((valid > j) & (first <= j), start + j, -1)
        h = _step(model, module, tokens[:, j], positions, hidden[:, j], table, kv_cache)
        done = valid == j + 1
        out[done] = h[done]
    live = valid > 0
    for k in range(num_drafts):
        drafts[live, k] = F.linear(rms_norm(out[live], module.norm, model.config.rms_norm_eps), module.head).argmax(-1)
        if k + 1 < num_drafts:  # the next draft reads this one and the module's own hidden
            positions = torch.where(live, start + valid + k, -1)
            out = _step(model, module, drafts[:, k].clamp(min=0), positions, out, table, kv_cache)
    return drafts


def _step(model: HostCausalLM, module: MtpModule, tokens: torch.Tensor, positions: torch.Tensor,
          hidden: torch.Tensor, table: torch.Tensor, kv_cache: list[LaneKV]) -> torch.Tensor:
    """One token per row through the module (-1: padding row, no KV write): its output hidden."""
    eps = model.config.rms_norm_eps
    embedded = module.embed[tokens]
    if not module.embeds_position_zero:
        embedded = torch.where((positions == 0)[:, None], 0.0, embedded)
    x = F.linear(torch.cat((rms_norm(embedded, module.enorm, eps), rms_norm(hidden, module.hnorm, eps)), -1),
                 module.eh_proj)
    step = DecodeRows.of(positions, kv_cache, model.lanes.rows_per_lane)
    return model.decoder.decode_layer(x, step, module.index, module.block, table,
                                      [lane_kv[0] for lane_kv in kv_cache])


def allocate_mtp_kv(model: HostCausalLM, kv_cache_shape: tuple[int, ...]) -> list[LaneKV]:
    """``kv[lane][0] = [K, V]`` of the MTP module's block, the target's page layout."""
    num_blocks, _heads, block_size, _dim = kv_cache_shape
    shape = (num_blocks, model.config.num_kv_heads, block_size, model.config.head_dim)
    return [[model.layer_storage(shape)] for _ in range(model.lanes.count)]

