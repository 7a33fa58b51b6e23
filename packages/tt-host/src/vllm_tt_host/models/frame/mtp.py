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
from vllm_tt_host.models.frame.hidden_drafts import DraftCall
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
    call = DraftCall.check(model, "mtp_forward", tokens, start_pos, num_valid_tokens, page_table, kv_cache,
                           num_drafts)
    duration = call.duration_s(model, model.mtp_costs) if model.mtp_costs is not None else 0.0
    program = functools.partial(_mtp_program, model, module, call, kv_cache)
    return model.queue.submit(program, duration).result()


def _mtp_program(model: HostCausalLM, module: MtpModule, call: DraftCall, kv_cache: list[LaneKV]) -> torch.Tensor:
    retained = model.retained
    if retained is None:
        raise HostModelInputError("mtp_forward before allocate_mtp_kv_cache: no hidden states were kept")
    tokens, start, table, num_drafts = call.tokens, call.start, call.table, call.num_drafts
    rows, hidden_size = tokens.shape[0], model.config.hidden_size
    hidden, first, valid = call.kept_hidden(retained, hidden_size)  # rows without kept states draft nothing
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
    step = DecodeRows.of(positions, model.lanes.rows_per_lane)
    return model.decoder.decode_layer(x, step, module.index, module.block, table,
                                      [lane_kv[0] for lane_kv in kv_cache])


def allocate_mtp_kv(model: HostCausalLM, kv_cache_shape: tuple[int, ...]) -> list[LaneKV]:
    """``kv[lane][0] = [K, V]`` of the MTP module's block, the target's page layout."""
    num_blocks, _heads, block_size, _dim = kv_cache_shape
    shape = (num_blocks, model.config.num_kv_heads, block_size, model.config.head_dim)
    return [[model.layer_storage(shape)] for _ in range(model.lanes.count)]

