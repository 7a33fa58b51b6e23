"""Mixed steps of host models (``mixed_forward``, the model contract's ``MIXED_KWARGS``): the
decode rows and one prompt chunk in one program, so a prompt no longer stalls the running
decodes for a step of its own.

The program walks the layers once; each layer runs the decode rows (``_decode_layer``), then the
chunk (``_prefill_layer``), so every family whose layers are the frame's hooks gets mixed steps
without code of its own. Each half computes exactly what ``decode_forward`` and
``prefill_forward`` compute for it (same ops, same shapes: the chunk is padded to its prefill
bucket, as a prefill row is) and the rows read no KV of each other, so the logits and the KV are
the two calls'. On the modelled clock the step reads the weights once
(``LaneLayout.mixed_s``); a device program is captured per declared ``(D, C)`` shape.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from vllm_tt_host.models.frame.inputs import PrefillRow, check_decode, check_kv, layer_tables, plan_prefill
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.shapes import HostModelInputError, TraceKey

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.generator import HostCausalLM


def fitting_shape(shapes: Sequence[Sequence[int]], decode_rows: int, chunk_tokens: int) -> tuple[int, int]:
    """The smallest declared ``(D, C)`` holding ``decode_rows`` live rows and the chunk."""
    fitting = sorted((int(d), int(c)) for d, c in shapes if decode_rows <= d and chunk_tokens <= c)
    if not fitting:
        raise HostModelInputError(
            f"a mixed step of {decode_rows} live decode rows and a {chunk_tokens}-token chunk fits none of the "
            f"declared mixed_shapes {[list(s) for s in shapes]}; the scheduler must pick a chunk that fits"
        )
    return fitting[0]


def mixed_forward(
    model: HostCausalLM, tokens: Any, start_pos: Any, page_table: Any, kv_cache: list[LaneKV], chunk_tokens: Any,
    chunk_start: int, chunk_page_table: Any, chunk_slot: int, chunk_completes: bool, enable_trace: bool,
    page_tables_per_layer: Sequence[Any] | None, chunk_page_tables_per_layer: Sequence[Any] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(decode logits [B, 1, V], chunk logits [1, 1, V] or None)``; every input is checked
    before any KV is written."""
    tokens = torch.as_tensor(tokens)
    tokens = tokens[:, 0] if tokens.dim() == 2 else tokens.reshape(-1)
    positions = torch.as_tensor(start_pos).reshape(-1).long()
    num_layers = model.config.num_layers
    check_kv(kv_cache, model.lanes)
    tables = layer_tables(torch.as_tensor(page_table), page_tables_per_layer, num_layers, tokens.shape[0])
    check_decode(tokens, positions, tables, kv_cache, model.lanes, model.max_seq_len)
    chunk = torch.as_tensor(chunk_tokens)
    if chunk.dim() != 2 or chunk.shape[0] != 1:
        raise HostModelInputError(f"chunk_tokens must be one row [1, end], got shape {tuple(chunk.shape)}")
    chunk_tables = layer_tables(torch.as_tensor(chunk_page_table), chunk_page_tables_per_layer, num_layers, 1)
    (row,) = plan_prefill(chunk, chunk_tables, kv_cache, [chunk.shape[1]], [int(chunk_start)], [int(chunk_slot)],
                          model.lanes, model.max_seq_len)
    if bool(positions[int(chunk_slot)] >= 0):
        raise HostModelInputError(f"chunk_slot {int(chunk_slot)} is also a live decode row of the step")
    shape = fitting_shape(model.model_capabilities.get("mixed_shapes", ()), int((positions >= 0).sum()),
                          row.end - row.start)
    if enable_trace:
        for device in model.lanes.devices:
            device.replay_trace(TraceKey.mixed(*shape))
    costs = model.costs
    duration = model.lanes.mixed_s(costs, positions, row) if costs is not None else 0.0
    program = functools.partial(_mixed_program, model, tokens, positions, tables, chunk[0], row, chunk_tables,
                                int(chunk_slot), bool(chunk_completes), kv_cache)
    return model.queue.submit(program, duration).result()


def _mixed_program(
    model: HostCausalLM, tokens: torch.Tensor, positions: torch.Tensor, tables: list[torch.Tensor],
    chunk: torch.Tensor, row: PrefillRow, chunk_tables: list[torch.Tensor], slot: int, completes: bool,
    kv_cache: list[LaneKV],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    model.slots.host_sampled()  # the host samples a mixed step: it sends every input next time
    if model.synthetic is not None:  # skipped math: the stand-in logits of both halves
        decode = model.synthetic.logits(tokens, positions)
        last = torch.tensor([row.end - 1])
        prompt = model.synthetic.logits(chunk[row.end - 1 : row.end], last)[0]
    else:
        decode, prompt = model.decoder.mixed(
            tokens, positions, tables, kv_cache, model.lanes.rows_per_lane, chunk[row.start : row.end], row.start,
            row.bucket, [t[0] for t in chunk_tables], row.lane,
        )
    model.slots.prefilled([slot])
    return decode[:, None, :], prompt[None, None, :] if completes else None
