"""Scheduler options read from ``--additional-config`` (``tt`` section), declared once here.

Each user option is an ``OptionSpec`` (name, type, default, minimum, doc): the platform's typed,
user-facing ``TTConfig`` declares its fields from these specs (and the configuration reference is
generated from them), and this module parses the ``tt`` section with the same specs, so a
scheduler built outside the platform (tests, benchmarks) still fails with a clear message.
``_prefill_trace_lens`` is the one key the platform writes for the scheduler
(``record_prefill_trace_lens``). No vLLM import here: the platform imports it at config time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_tt_scheduler.cost import STEP_COST_KEY, RooflineStepCost, read_step_cost


@dataclass(frozen=True)
class OptionSpec[T: (int, float)]:
    """One user option of the phase scheduler: ``--additional-config.tt.<name>``."""

    name: str
    kind: type[T]
    """``int`` (a whole number) or ``float`` (any finite number)."""
    default: T
    minimum: T
    doc: str
    """One line for the configuration reference."""

    def read(self, tt: Mapping[str, Any]) -> T:
        """The value in ``tt`` (or the default); raise ``ValueError`` naming the key when it is
        not a number of the right kind at least ``minimum``."""
        value: object = tt.get(self.name, self.default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (self.kind is int and not isinstance(value, int))
            or not self.minimum <= value < math.inf
        ):
            kind = "an integer" if self.kind is int else "a number"
            raise ValueError(
                f"--additional-config tt.{self.name}={value!r} is invalid: "
                f"use {kind} >= {self.minimum} (default {self.default})"
            )
        return self.kind(value)


# The defaults come from the benchmark in docs/scheduling.md.
PREFILL_BURST = OptionSpec(
    "prefill_burst", int, default=2, minimum=1,
    doc="Most consecutive prefill steps while decodes wait; bounds decode stall.",
)
PREFILL_HOLD = OptionSpec(
    "prefill_hold", float, default=0.35, minimum=0,
    doc="How long new prompts may wait so that they share one prefill step, relative to the "
    "decodes a prefill step stalls; 0 admits at once (lower time to first token, higher "
    "inter-token latency). See docs/scheduling.md.",
)
BLOCK_TOKENS = OptionSpec(
    "block_tokens", int, default=0, minimum=0,
    doc="Adaptive block output: up to this many tokens per request per decode step, from the "
    "model's own drafter verified inside its decode step (greedy requests; others decode one "
    "token a step). Needs a model declaring `max_block_tokens`; 0 (default) or 1: off. "
    "See docs/speculative-decoding.md.",
)
ITL_SLO_MS = OptionSpec(
    "itl_slo_ms", float, default=0.0, minimum=0,
    doc="SLO-aware mixed steps: the inter-token latency target in ms. Each mixed step's prompt "
    "chunk is then the largest captured chunk whose modelled step time stays within it (at least "
    "the smallest), so a prompt never stalls the decodes beyond the SLO. Needs `mixed_steps` and "
    "`step_cost`; 0 (default): the chunk covers the prompt when a captured shape allows. "
    "See docs/scheduling.md.",
)
USER_OPTIONS: tuple[OptionSpec[Any], ...] = (PREFILL_BURST, PREFILL_HOLD, BLOCK_TOKENS, ITL_SLO_MS)
"""The options users set; ``TTConfig`` declares one field from each."""

DEFAULT_PREFILL_BURST: int = PREFILL_BURST.default
DEFAULT_PREFILL_HOLD: float = PREFILL_HOLD.default

PREFILL_TRACE_LENS_KEY = "_prefill_trace_lens"
"""Set by the platform from the model's declared prefill trace lengths."""

MIXED_SHAPES_KEY = "_mixed_shapes"
"""Set by the platform from the model's ``mixed_shapes`` when ``tt.mixed_steps`` is on."""

#: Keys this package reads from ``additional_config["tt"]``. ``_``-prefixed keys are
#: set by the platform, never by users.
CONFIG_KEYS = (*(spec.name for spec in USER_OPTIONS), PREFILL_TRACE_LENS_KEY, STEP_COST_KEY, MIXED_SHAPES_KEY)


@dataclass(frozen=True)
class SchedulerOptions:
    """Policy knobs of the phase scheduler."""

    prefill_burst: int = DEFAULT_PREFILL_BURST
    """Consecutive prefill steps allowed while decodes are running; then one decode
    (``PREFILL_BURST``)."""

    prefill_hold: float = DEFAULT_PREFILL_HOLD
    """How long new prompts may wait to be batched into one prefill step (``PREFILL_HOLD``;
    see ``policy.PhasePolicy.hold_ratio``)."""

    prefill_chunk_cap: int | None = None
    """Largest prefill chunk per request (the model's largest prefill trace length),
    or None when the model declares no trace shapes (the step budget then rules)."""

    block_tokens: int = BLOCK_TOKENS.default
    """Most tokens a decode row commits per step (``BLOCK_TOKENS``; ``block_output``)."""

    mixed_shapes: tuple[tuple[int, int], ...] = ()
    """The ``(decode rows, chunk tokens)`` mixed programs the model runs (``MIXED_SHAPES_KEY``;
    ``mixed``); empty: phase-pure steps only."""

    itl_slo_ms: float = ITL_SLO_MS.default
    """The ITL target a mixed step's chunk is sized to (``ITL_SLO_MS``); 0: off."""

    step_cost: RooflineStepCost | None = None
    """Modelled step times of the served model and mesh (``cost``): the phase policy then
    decides by time (``cost_policy``); None counts steps (``policy.PhasePolicy``)."""

    @classmethod
    def from_additional_config(cls, additional_config: object) -> SchedulerOptions:
        """Read the ``tt`` section; raise ``ValueError`` naming the key on a bad value."""
        if additional_config is not None and not isinstance(additional_config, Mapping):
            raise ValueError(f"additional_config must be a mapping, got {type(additional_config).__name__}")
        tt = (additional_config or {}).get("tt", {}) or {}
        if not isinstance(tt, Mapping):
            raise ValueError(f"additional_config['tt'] must be a mapping, got {type(tt).__name__}")
        return cls(
            prefill_burst=PREFILL_BURST.read(tt),
            prefill_hold=PREFILL_HOLD.read(tt),
            block_tokens=BLOCK_TOKENS.read(tt),
            itl_slo_ms=ITL_SLO_MS.read(tt),
            prefill_chunk_cap=_chunk_cap(tt.get(PREFILL_TRACE_LENS_KEY)),
            mixed_shapes=_mixed_shapes(tt.get(MIXED_SHAPES_KEY, ())),
            step_cost=read_step_cost(tt),
        )


def record_prefill_trace_lens(tt: MutableMapping[str, Any], trace_lens: Sequence[int]) -> None:
    """Write the model's prefill trace lengths for the scheduler (which caps prefill chunks at
    the largest); raise ``ValueError`` when they are not positive ints."""
    _chunk_cap(trace_lens)
    tt[PREFILL_TRACE_LENS_KEY] = list(trace_lens)


def record_mixed_shapes(tt: MutableMapping[str, Any], shapes: Sequence[Sequence[int]]) -> None:
    """Write the model's mixed shapes for the scheduler (``tt.mixed_steps`` on); raise
    ``ValueError`` when they are not pairs of positive ints."""
    tt[MIXED_SHAPES_KEY] = [list(shape) for shape in _mixed_shapes(shapes)]


def _mixed_shapes(shapes: object) -> tuple[tuple[int, int], ...]:
    def positive(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if isinstance(shapes, str | bytes) or not isinstance(shapes, Sequence) or not all(
        isinstance(pair, Sequence) and len(pair) == 2 and all(positive(v) for v in pair) for pair in shapes
    ):
        raise ValueError(
            f"additional_config tt.{MIXED_SHAPES_KEY}={shapes!r} must be a list of [decode_rows, chunk_tokens] "
            "pairs of positive ints (set by the platform from the model's mixed_shapes)"
        )
    return tuple(sorted((int(d), int(c)) for d, c in shapes))


def _chunk_cap(trace_lens: object) -> int | None:
    if trace_lens is None:
        return None
    if isinstance(trace_lens, str | bytes) or not isinstance(trace_lens, Sequence):
        raise ValueError(
            f"additional_config tt.{PREFILL_TRACE_LENS_KEY}={trace_lens!r} must be a list of "
            "positive ints (set by the platform from the model's declared trace shapes)"
        )
    if not trace_lens:
        return None
    for length in trace_lens:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(
                f"additional_config tt.{PREFILL_TRACE_LENS_KEY}={list(trace_lens)!r} "
                "must hold positive ints only"
            )
    return max(trace_lens)
