"""The fixed (batch, length) shapes of a pooling model's programs, and how a step's prompts are
packed into calls of those shapes.

A traced device program has one input shape, so a pooling step is a few calls, each padded up
to a captured shape: prompts are grouped by the shortest shape length that holds them, and
each group runs in the calls that cost least: by modelled time when the runner has a cost
model (a compute-bound group of 3 runs as 2 + 1 rather than padded to 4; a weight-bound one as
one call of 4), else the fewest calls, then the least padding. Padding stays within one length
bucket. With lanes (``--data-parallel-size`` on a single-program model) a call runs its shape
on every lane's sub-mesh side by side, so it holds ``lanes x batch`` prompts for the time of
one sub-mesh's program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_tt_platform.cost.device_time import SERVED, ModelDims, ProgramCosts, parse_device_time
from vllm_tt_platform.errors import TTConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from vllm_tt_platform.mesh.shape import MeshRequest

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


ProgramTime = Callable[[PoolShape], float]
"""Modelled seconds of one program at a shape (``ProgramCosts.pool_s``)."""


@dataclass(frozen=True)
class PoolTiming:
    """The device-time model of the served checkpoint on the served mesh (the one
    ``host_device_time served`` replays): what each step's calls are packed by."""

    costs: ProgramCosts

    @classmethod
    def served(cls, hf_config: Any, mesh: MeshRequest, lanes: int = 1) -> PoolTiming | None:
        """One sub-mesh's model (of ``lanes``); None for a config that names no layer dims (the
        calls are then packed fewest first)."""
        try:
            dims = ModelDims.from_hf(hf_config)
        except (AttributeError, TypeError, ValueError):
            return None
        return cls(parse_device_time(SERVED).resolve(dims, mesh.shape, mesh.preset, lanes))

    def program_s(self, shape: PoolShape) -> float:
        return self.costs.pool_s(shape.batch, shape.length)


@dataclass(frozen=True)
class PoolCall:
    """One ``pool_forward`` call: the indices (into the step's rows) it runs, at ``shape`` on
    each of ``lanes`` sub-meshes (``rows[j]`` on lane ``j % lanes``)."""

    shape: PoolShape
    rows: tuple[int, ...]
    lanes: int = 1

    @property
    def batch(self) -> int:
        """The call's rows over all lanes (``pool_forward``'s ``B``)."""
        return self.shape.batch * self.lanes

    def slot(self, j: int) -> int:
        """Where ``rows[j]`` sits in the call's batch: lane ``j % lanes``'s rows are
        ``[lane * shape.batch, (lane + 1) * shape.batch)``, so small calls spread over the lanes."""
        return (j % self.lanes) * self.shape.batch + j // self.lanes


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
        grid: batches 1, 2, 4, ... up to ``min(max_num_seqs, 8)`` times lengths 32, 64, 96, 128,
        192, 256, 384, ... up to ``max_model_len``. A shape longer than ``max_model_len`` is an
        error."""
        if spec is not None:
            shapes = parse_shapes(spec)
            too_long = [s for s in shapes if s.length > max_model_len]
            if too_long:
                raise ValueError(f"shape {too_long[0]} is longer than --max-model-len {max_model_len}; "
                                 f"shorten it in {OPTION} or raise --max-model-len")
            return cls(shapes)
        lengths = _half_octaves(MIN_LENGTH, max_model_len)
        batches = _doubling(1, min(max_num_seqs, DEFAULT_MAX_BATCH))
        return cls(tuple(sorted(PoolShape(b, n) for b in batches for n in lengths)))

    @property
    def max_length(self) -> int:
        return max(s.length for s in self.shapes)

    def describe(self) -> str:
        return ", ".join(map(str, self.shapes))

    def plan(self, lengths: Sequence[int], program_s: ProgramTime | None = None, lanes: int = 1) -> list[PoolCall]:
        """Pack prompts of ``lengths`` (each at most ``max_length``) into calls over ``lanes``
        sub-meshes; ``program_s``: the modelled time of one sub-mesh's program (None: fewest
        calls, then least padding)."""
        by_length: dict[int, list[int]] = {}
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            by_length.setdefault(self.length_for(lengths[i]), []).append(i)
        calls: list[PoolCall] = []
        for length, rows in by_length.items():
            shapes = [s for s in self.shapes if s.length == length]
            for shape in _cheapest_cover(len(rows), shapes, program_s, lanes):
                calls.append(PoolCall(shape, tuple(rows[: shape.batch * lanes]), lanes))
                rows = rows[shape.batch * lanes :]
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


def _cheapest_cover(count: int, shapes: Sequence[PoolShape], program_s: ProgramTime | None,
                    lanes: int = 1) -> list[PoolShape]:
    """The calls (largest batch first) that run ``count`` rows of one length at the least cost
    (a call holds ``lanes x batch`` rows): modelled time, or (no cost model) one per call plus
    a tie-break on padded rows."""
    def cost(shape: PoolShape) -> float:
        return program_s(shape) if program_s is not None else 1 + shape.batch * 1e-6

    def after(rows: int, shape: PoolShape) -> tuple[float, list[PoolShape]]:
        rest = best[max(0, rows - shape.batch * lanes)]
        return rest[0] + cost(shape), [shape, *rest[1]]

    best: list[tuple[float, list[PoolShape]]] = [(0.0, [])]
    for rows in range(1, count + 1):
        best.append(min((after(rows, s) for s in shapes), key=lambda option: option[0]))
    return sorted(best[count][1], key=lambda s: -s.batch)


def _half_octaves(start: int, top: int) -> tuple[int, ...]:
    """``start`` doubling, with 1.5x each power from ``2 * start`` on (96, 192, 384, ...: whole
    device tiles), up to ``top``. A compute-bound long prompt padded to the next power of two
    wastes up to half its program; ``benchmarks/pooling_bench.py`` measured the half octaves
    cutting passage padding from 24-36% to 14-23% and lifting throughput over serving each
    request alone from 0.86x to 1.04x."""
    values = sorted({n for p in _doubling(start, top) for n in (p, p * 3 // 2) if n < top and n % start == 0}
                    - {start * 3 // 2})
    return (*values, top)


def _doubling(start: int, top: int) -> tuple[int, ...]:
    values = []
    value = start
    while value < top:
        values.append(value)
        value *= 2
    values.append(top)
    return tuple(values)
