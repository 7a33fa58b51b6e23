"""Verify steps of host models: ``decode_forward`` over ``[B, 1 + K]`` tokens (speculative
decoding), returning the logits after every position.

A verify step is a decode step of a fixed shape: each row feeds its last token followed by up
to ``K`` draft tokens at consecutive positions, ``num_valid_tokens[r]`` of the ``1 + K`` being
real (0: a padding row). Every real position writes its KV; positions whose drafts the sampler
rejects are overwritten by a later step, exactly as on the device. The host runs the ``1 + K``
positions as consecutive single-token passes of the decode math inside one program, so each
position's logits are bitwise those a plain decode step would have produced there (greedy
outputs cannot drift from serving without speculation); a device runs them as one trace. A
layer with a per-request state (Qwen 3.5's delta-nets) keeps the state after every position in
its own slot (``HostDecoder.verify_tables``), so the next step starts from the accepted one.

With ``sampling_params`` (device-side verification: every row greedy) the program ends in the
argmax of every position, and only those ``[B, 1 + K]`` token ids are read back.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from vllm_tt_host.models.frame.inputs import check_decode, check_kv, layer_tables
from vllm_tt_host.models.frame.readback import readback_nbytes
from vllm_tt_host.models.frame.sampling_step import plain_greedy
from vllm_tt_host.models.frame.shapes import HostModelInputError, TraceKey

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.generator import HostCausalLM

VERIFY_KWARG = "num_valid_tokens"
"""``decode_forward``'s verify argument (the model contract's ``VERIFY_KWARG``)."""

def sub_step_positions(start: torch.Tensor, valid: torch.Tensor, width: int) -> list[torch.Tensor]:
    """Position of each row at each of the ``width`` verify positions (-1 where the row has
    no real token there), from the row's first position ``start`` and real-token count."""
    return [torch.where(valid > j, start + j, torch.full_like(start, -1)) for j in range(width)]


def verify_forward(
    model: HostCausalLM, tokens: torch.Tensor, start_pos: Any, page_table: Any, kv_cache: Any,
    num_valid_tokens: Any, enable_trace: bool, page_tables_per_layer: Sequence[Any] | None,
    sampling_params: Any = None,
) -> torch.Tensor:
    """``[B, 1 + K, V]`` float32 logits: ``out[r, j]`` follows token ``tokens[r, j]`` at
    position ``start_pos[r] + j`` (meaningless where ``j >= num_valid_tokens[r]``); with
    ``sampling_params`` (greedy rows only), int64 ``[B, 1 + K]``, the argmax of each."""
    if tokens.dim() != 2:
        raise HostModelInputError(f"a verify step takes tokens [rows, 1 + K], got shape {tuple(tokens.shape)}")
    width = tokens.shape[1]
    start = torch.as_tensor(start_pos).reshape(-1).long()
    valid = torch.as_tensor(num_valid_tokens).reshape(-1).long()
    if valid.shape != start.shape or bool((valid < 0).any()) or (valid.numel() and int(valid.max()) > width):
        raise HostModelInputError(
            f"num_valid_tokens must hold one count in [0, {width}] per row, got {valid.tolist()}"
        )
    if bool(((valid > 0) & (start < 0)).any()):
        raise HostModelInputError("a verify row with real tokens needs start_pos >= 0")
    sampled = sampling_params is not None
    if sampled and (len(sampling_params) != tokens.shape[0] or not plain_greedy(sampling_params)):
        raise HostModelInputError(
            f"a device-sampling verify step takes {tokens.shape[0]} greedy sampling_params rows without "
            "penalties or logprobs (the runner verifies sampled rows on the host); got "
            f"{len(sampling_params)} rows, temperatures {list(sampling_params.temperature)}"
        )
    check_kv(kv_cache, model.lanes)
    page_table = torch.as_tensor(page_table)
    tables = layer_tables(page_table, page_tables_per_layer, model.config.num_layers, tokens.shape[0])
    steps = sub_step_positions(start, valid, width)
    for positions in steps:  # every position's block is checked before any KV is written
        check_decode(tokens[:, 0], positions, tables, kv_cache, model.lanes, model.max_seq_len)
    if enable_trace:
        key = TraceKey.verify(model.lanes.rows_per_lane, width, sampled)
        for device in model.lanes.devices:
            device.replay_trace(key)
    costs = model.costs
    duration = 0.0
    if costs is not None:  # the step, then the read-back of every position's logits or token
        duration = model.lanes.verify_s(costs, start.where(valid > 0, -1), valid)
        duration += costs.readback_s(readback_nbytes(tokens.shape[0], model.config.vocab_size, sampled=sampled,
                                                     logprobs=False, positions=width))
    program = functools.partial(_verify_program, model, tokens, steps, tables, kv_cache, sampled)
    return model.queue.submit(program, duration).result()


def _verify_program(
    model: HostCausalLM, tokens: torch.Tensor, steps: list[torch.Tensor], tables: list[torch.Tensor],
    kv_cache: Any, sampled: bool,
) -> torch.Tensor:
    model.slots.host_sampled()  # the host decides what a verify step keeps: it sends every input next time
    if sampled:
        out = torch.zeros(tokens.shape[0], tokens.shape[1], dtype=torch.int64)
    else:
        out = torch.zeros(tokens.shape[0], tokens.shape[1], model.config.vocab_size)
    for j, positions in enumerate(steps):
        if not bool((positions >= 0).any()):
            break  # the remaining positions are padding in every row
        column = tokens[:, j]
        if model.synthetic is not None and sampled:
            out[:, j] = model.synthetic.greedy(column, positions)
            continue
        if model.synthetic is not None:
            logits = model.synthetic.logits(column, positions)
        else:
            logits = model.decoder.decode(column, positions, model.decoder.verify_tables(tables, j), kv_cache,
                                          model.lanes.rows_per_lane)
            model.retain_decode(positions)
        out[:, j] = logits.argmax(dim=-1) if sampled else logits
    return out
