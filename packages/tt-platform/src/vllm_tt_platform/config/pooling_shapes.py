"""The fixed (batch, length) shapes of a pooling model's programs, and how a step's prompts are
packed into calls of those shapes.

A traced device program has one input shape, so a pooling step is a few calls, each padded up
to a captured shape: prompts are grouped by the shortest shape length that holds them, and
each group runs in calls of the smallest batch that holds it (or of the largest batch, then
the rest), so padding stays within one length bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_tt_platform.errors import TTConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

OPTION = "--additional-config.tt.pooling_shapes"
MIN_LENGTH = 32
"""The shortest default length (one device tile)."""
DEFAULT_MAX_BATCH = 8
"""The largest default batch: more rows per call only pay off once they share a length."""


@dataclass(frozen=True, order=True)
class PoolShape:
    batch: int
    length: int

    def __str__(self) -> str:
        return f"{self.batch}x{self.length}"


@dataclass(frozen=True)
class PoolCall:
    """One ``pool_forward`` call: the indices (into the step's rows) it runs, at ``shape``."""

    shape: PoolShape
    rows: tuple[int, ...]


def parse_shapes(spec: str) -> tuple[PoolShape, ...]:
    """``"1x64,8x128"`` -> shapes; raises ``ValueError`` naming the bad item."""
    shapes = set()
    for item in spec.split(","):
        batch, sep, length = item.strip().lower().partition("x")
        if not sep or not batch.isdigit() or not length.isdigit() or int(batch) < 1 or int(length) < 1:
            raise ValueError(f"{item.strip()!r} is not BATCHxLENGTH (e.g. 8x128); "
                             f"write {OPTION} as a comma-separated list such as 1x128,8x128,4x512")
        shapes.add(PoolShape(int(batch), int(length)))
    return tuple(sorted(shapes))


@dataclass(frozen=True)
class PoolingShapes:
    """The shapes warmup captures and the runner serves."""

    shapes: tuple[PoolShape, ...]

    @classmethod
    def resolve(cls, spec: str | None, max_num_seqs: int, max_model_len: int) -> PoolingShapes:
        """The shapes of ``spec`` (``--additional-config.tt.pooling_shapes``), else the default
        grid: batches 1, 2, 4, ... up to ``min(max_num_seqs, 8)`` times lengths 32, 64, ... up
        to ``max_model_len``. A shape longer than ``max_model_len`` is an error."""
        if spec is not None:
            shapes = parse_shapes(spec)
            too_long = [s for s in shapes if s.length > max_model_len]
            if too_long:
                raise ValueError(f"shape {too_long[0]} is longer than --max-model-len {max_model_len}; "
                                 f"shorten it in {OPTION} or raise --max-model-len")
            return cls(shapes)
        lengths = _doubling(MIN_LENGTH, max_model_len)
        batches = _doubling(1, min(max_num_seqs, DEFAULT_MAX_BATCH))
        return cls(tuple(sorted(PoolShape(b, n) for b in batches for n in lengths)))

    @property
    def max_length(self) -> int:
        return max(s.length for s in self.shapes)

    def describe(self) -> str:
        return ", ".join(map(str, self.shapes))

    def plan(self, lengths: Sequence[int]) -> list[PoolCall]:
        """Pack prompts of ``lengths`` (each at most ``max_length``) into calls."""
        by_length: dict[int, list[int]] = {}
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            by_length.setdefault(self.length_for(lengths[i]), []).append(i)
        calls: list[PoolCall] = []
        for length, rows in by_length.items():
            fits = [s.batch for s in self.shapes if s.length == length]
            while rows:
                batch = min((b for b in fits if b >= len(rows)), default=max(fits))
                calls.append(PoolCall(PoolShape(batch, length), tuple(rows[:batch])))
                rows = rows[batch:]
        return calls

    def length_for(self, prompt_len: int) -> int:
        """The shortest shape length holding a prompt of ``prompt_len`` tokens."""
        fitting = [s.length for s in self.shapes if s.length >= prompt_len]
        if not fitting:
            raise ValueError(f"a prompt of {prompt_len} tokens is longer than the longest pooling shape "
                             f"({self.max_length}); raise it with {OPTION}")
        return min(fitting)


def pooling_shapes_of(vllm_config: VllmConfig, spec: str | None) -> PoolingShapes:
    """The served model's shapes (``spec`` is the ``pooling_shapes`` option), checked against
    ``--max-model-len``."""
    try:
        return PoolingShapes.resolve(spec, vllm_config.scheduler_config.max_num_seqs,
                                     vllm_config.model_config.max_model_len)
    except ValueError as exc:
        raise TTConfigError(OPTION, spec, "BATCHxLENGTH shapes no longer than --max-model-len", str(exc)) from None


def _doubling(start: int, top: int) -> tuple[int, ...]:
    values = []
    value = start
    while value < top:
        values.append(value)
        value *= 2
    values.append(top)
    return tuple(values)
