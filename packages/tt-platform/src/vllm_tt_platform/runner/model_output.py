"""Reading what a model's prefill/decode returned: logits, or tokens sampled on device,
optionally with logprobs, possibly still on the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class ModelOutputError(RuntimeError):
    """A model returned something the contract does not allow."""


@dataclass(frozen=True)
class ModelOutput:
    logits: torch.Tensor | None = None
    """float ``[rows, V]``: next-token logits (host sampling)."""
    tokens: torch.Tensor | None = None
    """int64 ``[rows]``: tokens sampled on the device."""
    logprobs: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None
    """When the device computed them: float ``[rows]``, the sampled tokens' logprobs; or
    tt-metal's top-k form ``(top_logprobs [rows, K], top_ids [rows, K])``, sorted best first
    and containing the sampled token."""


def _is_top_k_pair(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)


def is_host_output(raw: Any) -> bool:
    if isinstance(raw, torch.Tensor):
        return True
    return isinstance(raw, tuple) and all(
        x is None or isinstance(x, torch.Tensor) or (i > 0 and _is_top_k_pair(x)) for i, x in enumerate(raw)
    )


def parse(raw: Any, *, sampled_on_device: bool, owner: str, rows: int | None = None) -> ModelOutput:
    """Normalise a host-side model result (tensor or ``(out, logprobs)``); with ``rows``, the
    result must have exactly that many rows (a decode answers every slot of the batch)."""
    logprobs = None
    if isinstance(raw, tuple):
        if not raw:
            raise ModelOutputError(f"{owner} returned an empty tuple")
        raw, logprobs = raw[0], (raw[1] if len(raw) > 1 else None)
    if not isinstance(raw, torch.Tensor):
        raise ModelOutputError(f"{owner} returned {type(raw).__name__}, expected a torch tensor")
    if sampled_on_device:
        if raw.is_floating_point():
            raise ModelOutputError(f"{owner} was asked to sample on device but returned logits")
        if rows is not None and (raw.dim() > 2 or raw.numel() != rows):
            raise ModelOutputError(f"{owner} returned tokens of shape {tuple(raw.shape)}, expected [{rows}]")
        kept = logprobs if isinstance(logprobs, torch.Tensor) or _is_top_k_pair(logprobs) else None
        return ModelOutput(tokens=raw.reshape(-1).to(torch.int64), logprobs=kept)
    if not raw.is_floating_point() or raw.dim() != 3 or (rows is not None and raw.shape[0] != rows):
        expected = f"[{rows}, S, V]" if rows is not None else "[rows, S, V]"
        raise ModelOutputError(f"{owner} returned {tuple(raw.shape)} {raw.dtype}, expected float logits {expected}")
    return ModelOutput(logits=raw[:, -1, :].float())


def read_decode(model: Any, raw: Any, *, sampled_on_device: bool, rows: int | None = None) -> ModelOutput:
    """Bring a decode result to the host (synchronously) and parse it."""
    if not is_host_output(raw):
        process = getattr(model, "process_decode_output_host", None)
        if process is None:
            raise ModelOutputError(
                f"{type(model).__qualname__}.decode_forward returned a device handle but the class "
                "has no process_decode_output_host()"
            )
        raw = process(raw, is_tokens=sampled_on_device)
    return parse(raw, sampled_on_device=sampled_on_device, owner=f"{type(model).__qualname__}.decode_forward",
                 rows=rows)
