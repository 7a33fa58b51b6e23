"""Block-output decode steps of host models (adaptive block output, the model contract's
``BLOCK_KWARG``): the model drafts with its own first layers and verifies the drafts with its
full forward pass inside one decode step, committing up to ``block_tokens[r]`` tokens per row.

The drafter is the model itself, cut short (self-speculation): its first ``draft_layers(n)``
layers, then its final norm and LM head. For row ``r`` with last token ``x`` at position ``c``
and limit ``m``:

1. ``m - 1`` early-exit passes draft ``d_0`` after ``x`` at ``c``, ``d_1`` after ``d_0`` at
   ``c + 1``, and so on (writing only the draft layers' KV, which step 2 rewrites);
2. full passes at ``c, c + 1, ...`` over ``x, d_0, ...`` give the target's token ``v_j`` after
   each position; the row stops after ``m`` tokens or at the first ``v_j != d_j`` (``v_j`` then
   corrects the draft);
3. the row commits ``v_0 .. v_{n-1}``: every one a full pass's greedy token, so exactly what
   ``n`` plain greedy decode steps give, and the KV of ``c .. c + n - 1`` is theirs.

The host runs each full pass as a single-token decode over the batch (bitwise a plain decode
step's logits, as ``verify`` does); a device runs the verify as one ``[B, m]`` trace, and the
modelled clock charges it so.

The same drafter alone is the model's own drafter of the ``custom_class`` rail
(``propose_drafts``, the contract's ``max_model_drafts``): step 1 for ``num_drafts[r]`` drafts,
which vLLM's verify steps then check.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm_tt_platform.cost.device_time import ProgramCosts

from vllm_tt_host.models.frame.inputs import check_decode, check_kv, layer_tables
from vllm_tt_host.models.frame.readback import readback_nbytes
from vllm_tt_host.models.frame.shapes import HostModelInputError, TraceKey

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.generator import HostCausalLM

BLOCK_KWARG = "block_tokens"
"""``decode_forward``'s block-output argument (the model contract's ``BLOCK_KWARG``)."""


def draft_layers(num_layers: int) -> int:
    """How many of the model's layers its drafter runs: the first half (at least one)."""
    return max(1, num_layers // 2)


def drafter_costs(costs: ProgramCosts) -> ProgramCosts:
    """The drafter's programs on the modelled clock: the first ``draft_layers`` of the timed
    model's layers (a named profile's, e.g. 40 of Llama 3.3 70B's 80, not the tiny checkpoint's)."""
    return costs if costs.dims is None else costs.with_layers(draft_layers(costs.dims.num_layers))


def block_forward(
    model: HostCausalLM, tokens: torch.Tensor, start_pos: Any, page_table: Any, kv_cache: Any,
    block_tokens: Any, enable_trace: bool, page_tables_per_layer: Sequence[Any] | None, width: int,
) -> torch.Tensor:
    """int64 ``[B, width]``: row ``r``'s committed tokens (1 to ``block_tokens[r]``), then -1."""
    tokens = tokens[:, 0] if tokens.dim() == 2 else tokens.reshape(-1)
    start = torch.as_tensor(start_pos).reshape(-1).long()
    limits = _row_counts(BLOCK_KWARG, block_tokens, start, width, live_min=1)
    tables = _tables(model, page_table, kv_cache, page_tables_per_layer, tokens.shape[0])
    longest = int(limits.max()) if limits.numel() else 0
    # The full passes' positions (row r at c + j while j < m_r), then the drafter's (d_j after
    # position c + j while j < m_r - 1).
    steps = [torch.where(limits > j, start + j, torch.full_like(start, -1)) for j in range(longest)]
    for positions in steps:  # every position's block is checked before any KV is written
        check_decode(tokens, positions, tables, kv_cache, model.lanes, model.max_seq_len)
    drafting = [torch.where(limits > j + 1, start + j, torch.full_like(start, -1)) for j in range(longest - 1)]
    if enable_trace:
        key = TraceKey.block(model.lanes.rows_per_lane, width)
        for device in model.lanes.devices:
            device.replay_trace(key)
    layers = draft_layers(model.config.num_layers)
    costs = model.costs
    duration = 0.0
    if costs is not None:  # the drafter's passes, the verify, the read-back of the committed ids
        drafter = drafter_costs(costs)
        duration = sum(model.lanes.decode_s(drafter, positions) for positions in drafting)
        duration += model.lanes.verify_s(costs, start, limits)
        duration += costs.readback_s(readback_nbytes(tokens.shape[0], model.config.vocab_size, sampled=True,
                                                     logprobs=False, positions=width))
    program = functools.partial(_block_program, model, tokens.long(), steps, drafting, tables, kv_cache, layers,
                                width)
    return model.queue.submit(program, duration).result()


def _block_program(
    model: HostCausalLM, tokens: torch.Tensor, steps: list[torch.Tensor], drafting: list[torch.Tensor],
    tables: list[torch.Tensor], kv_cache: Any, layers: int, width: int,
) -> torch.Tensor:
    model.slots.host_sampled()  # the host reads the block: it sends every input next time
    rows_per_lane = model.lanes.rows_per_lane
    drafts = _drafts(model, tokens, drafting, tables, kv_cache, layers, len(steps))
    out = torch.full((tokens.shape[0], width), -1, dtype=torch.int64)
    open_rows = steps[0] >= 0 if steps else torch.zeros(tokens.shape[0], dtype=torch.bool)
    fed = tokens
    for j, positions in enumerate(steps):
        positions = positions.where(open_rows, -1)
        if model.synthetic is not None:
            target = model.synthetic.greedy(fed, positions)
        else:
            target = model.decoder.decode(fed, positions, tables, kv_cache, rows_per_lane).argmax(dim=-1)
        out[open_rows, j] = target[open_rows]
        # A row goes on while its draft matched and its limit has room (drafts[:, j] of a row at
        # its limit is never drafted: the limit check ends it first).
        open_rows = open_rows & (target == drafts[:, j]) & (steps[j + 1] >= 0 if j + 1 < len(steps) else False)
        if not bool(open_rows.any()):
            break
        fed = drafts[:, j]
    return out


def _row_counts(name: str, values: Any, start: torch.Tensor, width: int, live_min: int) -> torch.Tensor:
    """int64 ``[B]``: one count per row in ``[0, width]``, at least ``live_min`` for live rows
    and 0 for padding rows (``start`` -1)."""
    counts = torch.as_tensor(values).reshape(-1).long()
    if counts.shape != start.shape or bool((counts < 0).any()) or (counts.numel() and int(counts.max()) > width):
        raise HostModelInputError(f"{name} must hold one count in [0, {width}] per row, got {counts.tolist()}")
    live = start >= 0
    if bool((live & (counts < live_min)).any()) or bool((~live & (counts > 0)).any()):
        floor = f"at least {live_min} for live rows and " if live_min else ""
        raise HostModelInputError(
            f"{name} must be {floor}0 for padding rows (start_pos -1); got {counts.tolist()} for start_pos "
            f"{start.tolist()}"
        )
    return counts


def _tables(model: HostCausalLM, page_table: Any, kv_cache: Any, page_tables_per_layer: Sequence[Any] | None,
            rows: int) -> list[torch.Tensor]:
    """Each layer's page table, once the KV cache is checked against the lanes."""
    check_kv(kv_cache, model.lanes)
    return layer_tables(torch.as_tensor(page_table), page_tables_per_layer, model.config.num_layers, rows)


def _drafts(model: HostCausalLM, tokens: torch.Tensor, drafting: list[torch.Tensor], tables: list[torch.Tensor],
            kv_cache: Any, layers: int, width: int) -> torch.Tensor:
    """int64 ``[B, width]``: pass ``j`` feeds each row's previous draft (first: ``tokens``) at
    ``drafting[j]`` through the first ``layers`` layers and takes its argmax (rows at -1 draft
    nothing that counts)."""
    drafts = torch.zeros(tokens.shape[0], width, dtype=torch.long)
    fed = tokens
    for j, positions in enumerate(drafting):
        if model.synthetic is not None:  # skipped math: the drafter guesses the synthetic target's tokens
            fed = model.synthetic.greedy(fed, positions)
        else:
            fed = model.decoder.early_exit(fed, positions, tables, kv_cache, model.lanes.rows_per_lane,
                                           layers).argmax(dim=-1)
        drafts[:, j] = fed
    return drafts


def propose_drafts(
    model: HostCausalLM, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, num_drafts: Any,
    page_tables_per_layer: Sequence[Any] | None, width: int,
) -> torch.Tensor:
    """int64 ``[B, width]``: up to ``num_drafts[r]`` drafts after row ``r``'s last token at
    ``start_pos[r]``, then -1 (the contract's ``propose_drafts``). Writes only the draft layers'
    KV at ``start_pos[r] ..`` (the verify step rewrites it) and leaves the device's decode
    inputs as they were."""
    tokens = torch.as_tensor(tokens).reshape(-1).long()
    start = torch.as_tensor(start_pos).reshape(-1).long()
    counts = _row_counts("num_drafts", num_drafts, start, width, live_min=0)
    tables = _tables(model, page_table, kv_cache, page_tables_per_layer, tokens.shape[0])
    longest = int(counts.max()) if counts.numel() else 0
    drafting = [torch.where(counts > j, start + j, torch.full_like(start, -1)) for j in range(longest)]
    for positions in drafting:  # every position's block is checked before any KV is written
        check_decode(tokens, positions, tables, kv_cache, model.lanes, model.max_seq_len)
    layers = draft_layers(model.config.num_layers)
    duration = 0.0
    if model.costs is not None:  # the drafter's passes, the read-back of the draft ids
        drafter = drafter_costs(model.costs)
        duration = sum(model.lanes.decode_s(drafter, positions) for positions in drafting)
        duration += model.costs.readback_s(readback_nbytes(tokens.shape[0], model.config.vocab_size, sampled=True,
                                                           logprobs=False, positions=width))

    def program() -> torch.Tensor:
        drafts = _drafts(model, tokens, drafting, tables, kv_cache, layers, width)
        return drafts.where(torch.arange(width) < counts[:, None], -1)

    return model.queue.submit(program, duration).result()
