"""Fault hooks of overlapped decode: the points of a step's life where tests stretch time to
provoke the thread orderings that break naive implementations.

Production code calls ``faults.delay(point)`` at each point and ``faults.race(finalise)`` after
each overlapped submission; the default ``NO_FAULTS`` does nothing. The injectors themselves
(seeded random sleeps, scripted sleeps, raced finalisation) are test support and ship in no
wheel: ``testing/vllm_tt_testing/faults.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class DelayPoint(enum.Enum):
    SUBMIT = "submit"
    """Runner: the decode program was submitted, its readback not yet started."""
    READBACK = "readback"
    """Device: a readback is about to complete (its event not yet recorded)."""
    FINALISE = "finalise"
    """Finaliser (any thread): inside the exactly-once section, before waiting on events."""
    APPLY = "apply"
    """Runner: a finalised step is about to be applied to the host batch."""


class Faults:
    """No faults: the null object every component starts with."""

    def delay(self, point: DelayPoint) -> None:
        """Called when execution reaches ``point``."""

    def race(self, finalise: Callable[[], object]) -> None:
        """Called once per overlapped step with a callable that finalises it."""


NO_FAULTS = Faults()
