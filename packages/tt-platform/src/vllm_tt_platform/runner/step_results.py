"""One result per step kind, as ``sample_tokens`` receives it from ``execute_model``: the runner
turns each kind into vLLM's output its own way (``StepResult``; ``calls`` has the matching call
kinds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_tt_platform.runner.async_decode import InFlightStep
from vllm_tt_platform.runner.calls import VerifyCall
from vllm_tt_platform.runner.model_output import ModelOutput, ModelOutputError


@dataclass(frozen=True)
class PrefillResult:
    """The prefill rows' output, in call order."""

    output: ModelOutput


@dataclass(frozen=True)
class DecodeResult:
    """A decode read back in the step, one output row per slot."""

    output: ModelOutput


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


StepResult = PrefillResult | DecodeResult | VerifyResult | InFlightStep
"""What one step left for ``sample_tokens``; ``InFlightStep`` is an overlapped decode whose
tokens vLLM resolves later (``async_decode``)."""
