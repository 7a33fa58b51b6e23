"""Step cost model: how long a prefill or a decode step takes on the served mesh, in seconds.

The scheduler decides by time only when it is handed one (``record_step_cost``, written by the
platform from its device-time model of the served model on the served mesh, or from the user's
override); without one it counts steps, as it always did. No platform import here: the model
arrives as plain numbers in the ``tt`` section, like the prefill trace lengths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

STEP_COST_KEY = "_step_cost"
"""Set by the platform: the cost model of the served model and mesh (``RooflineStepCost`` fields)."""


class StepCostModel(Protocol):
    """Modelled device time of one engine step, what the cost-aware phase policy decides by."""

    @property
    def description(self) -> str:
        """Which model and mesh, for the startup log."""
        ...

    def prefill_s(self, tokens: int, rows: int) -> float:
        """A prefill-only step of ``tokens`` new tokens over ``rows`` prompts (no cached prefix)."""
        ...

    def prefill_compute_s(self, tokens: int, rows: int) -> float:
        """The prompts' own compute in that step, without the weight-streaming floor every
        step pays (the step takes the longer of the two)."""
        ...

    def decode_s(self, rows: int, context: int) -> float:
        """A decode-only step of ``rows`` rows reading ``context`` KV positions in all."""
        ...

    def mixed_s(self, rows: int, context: int, chunk: int, start: int) -> float:
        """A mixed step: ``rows`` decode rows reading ``context`` KV positions and one prompt
        chunk of ``chunk`` tokens after ``start`` cached ones, in one program."""
        ...


@dataclass(frozen=True)
class RooflineStepCost:
    """A roofline: a forward pass streams the weights once (the floor of every step), a decode
    step adds the KV it reads, a prefill row adds matmul and attention compute; a step takes the
    longer of streaming and compute. The host backend's device-time model has this form."""

    program_s: float
    """Fixed cost of one program (dispatch, per-layer collectives); a prefill row is one program."""
    weights_s: float
    """Streaming the weights from DRAM once."""
    kv_s_per_token: float
    """Reading one KV position (all layers) in a decode step."""
    prefill_s_per_token: float
    """Matmul compute of one prefill token."""
    attention_s_per_token_pair: float
    """Attention compute per (new token, earlier position) pair of a prefill row."""
    description: str = "roofline"

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name != "description" and (
                isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf
            ):
                raise ValueError(
                    f"additional_config tt.{STEP_COST_KEY}.{item.name}={value!r} must be a finite number >= 0 "
                    "(set by the platform from the device-time model; see docs/scheduling.md)"
                )

    def prefill_s(self, tokens: int, rows: int) -> float:
        if tokens <= 0 or rows <= 0:
            return 0.0
        return max(self.program_s + self.weights_s, self.prefill_compute_s(tokens, rows))

    def prefill_compute_s(self, tokens: int, rows: int) -> float:
        if tokens <= 0 or rows <= 0:
            return 0.0
        per_row = tokens / rows
        return rows * (
            self.program_s + per_row * self.prefill_s_per_token
            + self.attention_s_per_token_pair * per_row * per_row / 2
        )

    def decode_s(self, rows: int, context: int) -> float:
        if rows <= 0:
            return 0.0
        return self.program_s + self.weights_s + context * self.kv_s_per_token

    def mixed_s(self, rows: int, context: int, chunk: int, start: int) -> float:
        """One weight stream for both halves; the compute is every token's matmuls and each
        row's attention (a decode row's query over its context, the chunk's as in a prefill)."""
        compute = self.program_s + (rows + chunk) * self.prefill_s_per_token + self.attention_s_per_token_pair * (
            context + chunk * (start + chunk / 2))
        return max(self.decode_s(rows, context), compute)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: object) -> RooflineStepCost:
        """Read what ``record_step_cost`` wrote; ``ValueError`` naming the key otherwise."""
        names = {item.name for item in fields(cls)}
        if not isinstance(value, Mapping) or set(value) != names:
            raise ValueError(
                f"additional_config tt.{STEP_COST_KEY}={value!r} must be a mapping with keys "
                f"{sorted(names)} (set by the platform, never by users)"
            )
        return cls(**{name: value[name] for name in names})


def record_step_cost(tt: MutableMapping[str, Any], cost: RooflineStepCost) -> None:
    """Hand the scheduler the step cost model of the served model and mesh."""
    tt[STEP_COST_KEY] = cost.to_dict()


def read_step_cost(tt: Mapping[str, Any]) -> RooflineStepCost | None:
    """The cost model in ``tt``, or None (the step-counted policy)."""
    value = tt.get(STEP_COST_KEY)
    return None if value is None else RooflineStepCost.from_dict(value)
