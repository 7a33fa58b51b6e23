"""One result per step kind, as ``sample_tokens`` receives it from ``execute_model``: the runner
turns each kind into vLLM's output its own way (``StepResult``; ``calls`` has the matching call
kinds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from vllm.v1.outputs import ModelRunnerOutput

from vllm_tt_platform.runner.async_decode import InFlightStep
from vllm_tt_platform.runner.calls import BlockCall, MixedCall, VerifyCall
from vllm_tt_platform.runner.model_output import ModelOutput, ModelOutputError, parse
from vllm_tt_platform.runner.step import ScheduledRow


@dataclass(frozen=True)
class PrefillResult:
    """The prefill rows' output, in call order."""

    output: ModelOutput


@dataclass(frozen=True)
class DecodeResult:
    """A decode read back in the step, one output row per slot."""

    output: ModelOutput


@dataclass(frozen=True)
class MixedResult:
    """A mixed step's logits: one row per slot (its decode rows), then the chunk's row when the
    chunk ended its prompt (``step_sampling`` reads the chunk's as the last row)."""

    output: ModelOutput

    @classmethod
    def read(cls, model: Any, raw: Any, call: MixedCall) -> MixedResult:
        """``mixed_forward``'s answer to ``call``: ``(decode logits [B, 1, V], chunk logits
        [1, 1, V] or None)`` (model contract: ``MIXED_KWARGS``)."""
        owner = f"{type(model).__qualname__}.mixed_forward"
        if not isinstance(raw, tuple) or len(raw) != 2:
            raise ModelOutputError(f"{owner} returned {type(raw).__name__}; expected (decode_logits, chunk_logits) "
                                   "(model contract: MIXED_KWARGS)")
        decode = parse(raw[0], sampled_on_device=False, owner=owner, rows=call.decode.tokens.shape[0])
        logits = decode.logits
        if call.chunk_completes:
            chunk = parse(raw[1], sampled_on_device=False, owner=f"{owner} (chunk)", rows=1)
            logits = torch.cat((cast(torch.Tensor, logits), cast(torch.Tensor, chunk.logits)))
        elif raw[1] is not None:
            raise ModelOutputError(f"{owner} returned chunk logits for a chunk that does not end its prompt; "
                                   "expected None (model contract: MIXED_KWARGS)")
        return cls(ModelOutput(logits=logits))


@dataclass(frozen=True)
class VerifyResult:
    """A verify step's output, one row per slot, and the drafts it verified."""

    output: torch.Tensor
    """The device's argmax tokens int64 ``[num_slots, 1 + K]`` (it verified greedy rows), or
    float logits ``[num_slots, 1 + K, V]`` for vLLM's rejection sampler."""
    drafts: dict[str, list[int]]

    @classmethod
    def read(cls, model: Any, raw: Any, call: VerifyCall) -> VerifyResult:
        """``decode_forward``'s answer to ``call`` on the host, checked against the verify shape."""
        on_device = call.sampling is not None
        if hasattr(model, "process_decode_output_host"):
            raw = model.process_decode_output_host(raw, is_tokens=on_device)
        expected = (*call.inputs.tokens.shape,)
        shape_ok = isinstance(raw, torch.Tensor) and tuple(raw.shape[:2]) == expected and (
            raw.dim() == 2 and not raw.is_floating_point() if on_device else raw.dim() == 3 and raw.is_floating_point()
        )
        if not shape_ok:
            shape = tuple(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
            wanted = f"int tokens [{expected[0]}, {expected[1]}]" if on_device else \
                f"float logits [{expected[0]}, {expected[1]}, V]"
            raise ModelOutputError(
                f"{type(model).__qualname__}.decode_forward returned {shape} for a verify step; expected "
                f"{wanted} (model contract: VERIFY_KWARG)"
            )
        return cls(raw.long() if on_device else raw.float(), call.drafts)


@dataclass(frozen=True)
class BlockResult:
    """A block-output step's committed tokens, per row in plan order (1 up to its limit)."""

    tokens: list[list[int]]

    @classmethod
    def read(cls, model: Any, raw: Any, call: BlockCall, rows: list[ScheduledRow]) -> BlockResult:
        """``decode_forward``'s answer to ``call``: int ``[num_slots, W]``, each row's committed
        tokens then -1, checked against each row's limit (model contract: ``BLOCK_KWARG``)."""
        if hasattr(model, "process_decode_output_host"):
            raw = model.process_decode_output_host(raw, is_tokens=True)
        owner = f"{type(model).__qualname__}.decode_forward"
        num_slots = call.block_tokens.shape[0]
        if not isinstance(raw, torch.Tensor) or raw.dim() != 2 or raw.shape[0] != num_slots or raw.is_floating_point():
            shape = tuple(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
            raise ModelOutputError(f"{owner} returned {shape} for a block-output step; expected int tokens "
                                   f"[{num_slots}, W] (model contract: BLOCK_KWARG)")
        tokens = []
        for r in rows:
            row = raw[r.state.slot].tolist()
            n = row.index(-1) if -1 in row else len(row)
            limit = int(call.block_tokens[r.state.slot])
            if not 1 <= n <= limit or any(t != -1 for t in row[n:]):
                raise ModelOutputError(f"{owner} committed {row} for slot {r.state.slot}; expected 1 to {limit} "
                                       "tokens, then -1 (model contract: BLOCK_KWARG)")
            tokens.append([int(t) for t in row[:n]])
        return cls(tokens)


def committed_output(rows: list[ScheduledRow], tokens: list[list[int]]) -> ModelRunnerOutput:
    """A step whose rows committed a variable number of tokens each (a verify step's accepted
    drafts and one more; a block-output step's block): appended to the rows, as vLLM's
    scheduler reads them (it trims at a stop token, ``max_tokens`` or the model length)."""
    for r, row_tokens in zip(rows, tokens, strict=True):
        r.state.output_token_ids.extend(row_tokens)
    return ModelRunnerOutput(
        req_ids=[r.state.req_id for r in rows],
        req_id_to_index={r.state.req_id: i for i, r in enumerate(rows)},
        sampled_token_ids=tokens,
        logprobs=None,
        prompt_logprobs_dict={},
    )


StepResult = PrefillResult | DecodeResult | MixedResult | VerifyResult | BlockResult | InFlightStep
"""What one step left for ``sample_tokens``; ``InFlightStep`` is an overlapped decode whose
tokens vLLM resolves later (``async_decode``)."""
