"""The lane contract between the platform and the scheduler: the lane shape and block numbering.

With ``--data-parallel-size N --max-num-seqs M`` on a single-program model, the platform folds
data parallelism into N in-process lanes: it records N and M in the ``tt`` section
(``LaneShape.record``) and raises ``max_num_seqs`` to N*M (the runner's row grid). Each lane's
scheduler must still see M, or the lanes together could admit more rows than the grid has.
Each lane numbers the blocks of its own KV pool from 0; ``BlockNumbering`` is how the scheduler
numbers them for the runner, and how the runner reads them back. No vLLM import here: the
platform reads this module at config time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

#: Keys of ``additional_config["tt"]`` set by the platform when it folds DP into lanes.
LANES_KEY = "_lanes"
ROWS_PER_LANE_KEY = "_rows_per_lane"


def _lane_key_error(key: str, value: object) -> ValueError:
    return ValueError(
        f"additional_config tt.{key}={value!r}: the lane coordinator needs a positive "
        "int, set by the TT platform when it folds --data-parallel-size into lanes "
        "(scheduler_cls vllm_tt_scheduler.TTLaneCoordinator is not meant to be set by hand)"
    )


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _lane_key_error(key, value)
    return value


@dataclass(frozen=True)
class LaneShape:
    """How many lanes run in the engine process, and the rows (sequences) each owns."""

    lanes: int
    rows_per_lane: int

    def __post_init__(self) -> None:
        _positive_int(LANES_KEY, self.lanes)
        _positive_int(ROWS_PER_LANE_KEY, self.rows_per_lane)

    @property
    def rows(self) -> int:
        return self.lanes * self.rows_per_lane

    def record(self, tt: MutableMapping[str, Any]) -> None:
        """Write the shape into the ``tt`` section, for the scheduler and the other processes."""
        tt[LANES_KEY] = self.lanes
        tt[ROWS_PER_LANE_KEY] = self.rows_per_lane

    @staticmethod
    def recorded(tt: Mapping[str, Any]) -> bool:
        """Whether the platform already folded data parallelism into lanes here."""
        return LANES_KEY in tt

    @classmethod
    def from_tt_section(cls, tt: Mapping[str, Any]) -> LaneShape | None:
        """The recorded shape, or None when none is recorded (one lane); raise ``ValueError``
        naming the key when a value is not a positive int or only one of the keys is set."""
        if not isinstance(tt, Mapping):
            raise ValueError(f"additional_config['tt'] must be a mapping, got {type(tt).__name__}")
        if LANES_KEY not in tt and ROWS_PER_LANE_KEY not in tt:
            return None
        lanes = _positive_int(LANES_KEY, tt.get(LANES_KEY))
        return cls(lanes, _positive_int(ROWS_PER_LANE_KEY, tt.get(ROWS_PER_LANE_KEY)))

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> LaneShape:
        """Read the shape; raise ``ValueError`` naming the setting when it is missing or off."""
        shape = cls.from_tt_section((vllm_config.additional_config or {}).get("tt") or {})
        if shape is None:
            raise _lane_key_error(LANES_KEY, None)
        sched = vllm_config.scheduler_config
        if sched.max_num_seqs != shape.rows:
            raise ValueError(
                f"max_num_seqs={sched.max_num_seqs} must equal lanes x rows per lane "
                f"({shape.lanes} x {shape.rows_per_lane} = {shape.rows}): the runner's row grid; "
                "pass --max-num-seqs as the rows of one lane and let the platform multiply it"
            )
        active = sched.max_num_active_seqs
        if active is not None:
            raise ValueError(
                f"max_num_active_seqs={active} is not supported with lanes "
                "(which lane would it limit?); remove --max-num-active-seqs and size each lane "
                "with --max-num-seqs"
            )
        events = vllm_config.kv_events_config
        if events is not None and events.enable_kv_cache_events:
            raise ValueError(
                "kv_events_config.enable_kv_cache_events=True is not supported with lanes: each "
                "lane has its own KV pool with its own block ids, and one publisher per lane "
                "would bind the same endpoint; remove --kv-events-config"
            )
        return shape

    def lane_vllm_config(self, vllm_config: Any) -> Any:
        """A shallow copy of ``vllm_config`` whose scheduler config admits ``rows_per_lane``.

        Everything else (model, cache, ``additional_config``) is shared with the engine's config.
        """
        scheduler_config = copy.copy(vllm_config.scheduler_config)
        scheduler_config.max_num_seqs = self.rows_per_lane
        lane_config = copy.copy(vllm_config)
        lane_config.scheduler_config = scheduler_config
        return lane_config


class _BlockIds(Protocol):
    def __mod__(self, other: int, /) -> Any: ...


_Ids = TypeVar("_Ids", bound=_BlockIds)


@dataclass(frozen=True)
class BlockNumbering:
    """Lane-local block ids to the runner's global ones and back.

    The runner holds one KV cache per lane and tells them apart by block id:
    global id = lane * blocks_per_lane + lane-local id. It finds a new request's lane from its
    first block (``lane_of``) and its pages with ``local``.
    """

    blocks_per_lane: int

    def groups(self, lane: int, block_ids: tuple[list[int], ...]) -> tuple[list[int], ...]:
        if lane == 0:
            return block_ids
        offset = lane * self.blocks_per_lane
        return tuple([block + offset for block in group] for group in block_ids)

    def ids(self, lane: int, block_ids: list[int]) -> list[int]:
        offset = lane * self.blocks_per_lane
        return [block + offset for block in block_ids]

    def lane_of(self, block_id: int) -> int:
        """The lane whose KV pool holds global block ``block_id``."""
        return block_id // self.blocks_per_lane

    def local(self, block_ids: _Ids) -> _Ids:
        """Global block id(s) (an int or an integer tensor/array) as ids in their lane's pool."""
        result: _Ids = block_ids % self.blocks_per_lane
        return result
