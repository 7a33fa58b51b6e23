"""The lane shape the platform recorded, and the config each lane's scheduler is built with.

With ``--data-parallel-size N --max-num-seqs M`` on a single-program model, the platform folds
data parallelism into N in-process lanes: it records N and M in the ``tt`` section and raises
``max_num_seqs`` to N*M (the runner's row grid). Each lane's scheduler must still see M, or the
lanes together could admit more rows than the grid has.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Keys of ``additional_config["tt"]`` set by the platform when it folds DP into lanes.
LANES_KEY = "_lanes"
ROWS_PER_LANE_KEY = "_rows_per_lane"


@dataclass(frozen=True)
class LaneShape:
    """How many lanes run in the engine process, and the rows (sequences) each owns."""

    lanes: int
    rows_per_lane: int

    @property
    def rows(self) -> int:
        return self.lanes * self.rows_per_lane

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> LaneShape:
        """Read the shape; raise ``ValueError`` naming the setting when it is missing or off."""
        tt = (vllm_config.additional_config or {}).get("tt") or {}
        if not isinstance(tt, Mapping):
            raise ValueError(f"additional_config['tt'] must be a mapping, got {type(tt).__name__}")
        values: dict[str, Any] = {key: tt.get(key) for key in (LANES_KEY, ROWS_PER_LANE_KEY)}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"additional_config tt.{key}={value!r}: the lane coordinator needs a positive "
                    "int, set by the TT platform when it folds --data-parallel-size into lanes "
                    "(scheduler_cls vllm_tt_scheduler.TTLaneCoordinator is not meant to be set by hand)"
                )
        shape = cls(values[LANES_KEY], values[ROWS_PER_LANE_KEY])
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
