"""Fault hooks: the points of a step's life where tests stretch time to provoke the thread
orderings that break naive implementations, or make the (host) device fail.

Production code calls ``faults.delay(point)`` at each point, ``faults.race(finalise)`` after
each overlapped submission and ``faults.readback(value)`` on each host-device readback; the
default ``NO_FAULTS`` does nothing. A hook may sleep, block or raise (a failing program). The
injectors themselves (seeded random sleeps, scripted sleeps, raced finalisation, device faults)
are test support and ship in no wheel: ``testing/vllm_tt_testing/faults.py``,
``testing/vllm_tt_testing/device_faults.py``.
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
    PREFILL = "prefill"
    """Device: a prefill program is about to run."""
    DECODE = "decode"
    """Device: a decode program is about to run."""


class Faults:
    """No faults: the null object every component starts with."""

    def delay(self, point: DelayPoint) -> None:
        """Called when execution reaches ``point``."""

    def race(self, finalise: Callable[[], object]) -> None:
        """Called once per overlapped step with a callable that finalises it."""

    def readback(self, value: object) -> object:
        """What a completed readback hands the host (``value`` unless an injector corrupts it)."""
        return value


NO_FAULTS = Faults()
