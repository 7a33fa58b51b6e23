"""Device faults for end-to-end tests, armed inside a ``vllm serve`` process tree.

The server is started with ``TT_HOST_FAULTS=vllm_tt_testing.device_faults:from_env`` (the host
backend installs what ``from_env`` returns on its emulated device), ``TT_TEST_DEVICE_FAULT`` (a
``FaultKind`` value) and ``TT_TEST_DEVICE_FAULT_ARM`` (a path). The fault fires only once that
path exists, so warmup and a first request run clean and the test arms the fault when it wants.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from vllm_tt_platform.faults import DelayPoint, Faults

KIND_ENV = "TT_TEST_DEVICE_FAULT"
ARM_ENV = "TT_TEST_DEVICE_FAULT_ARM"
FACTORY = "vllm_tt_testing.device_faults:from_env"
"""What ``TT_HOST_FAULTS`` is set to."""


class FaultKind(enum.Enum):
    PREFILL_RAISES = "prefill_raises"
    """The next prefill program raises."""
    DECODE_RAISES = "decode_raises"
    """The next decode program raises."""
    READBACK_HANGS = "readback_hangs"
    """The next readback never completes (the device thread blocks for good)."""
    READBACK_GARBAGE = "readback_garbage"
    """Readbacks return a tensor of the wrong shape."""


class InjectedDeviceError(RuntimeError):
    """What a failing program raises (stands for a ttnn runtime error)."""


GARBAGE = torch.zeros((2, 3), dtype=torch.int64)
"""A readback of the wrong shape: six values in two rows, for a batch of any other size."""


@dataclass
class DeviceFault(Faults):
    kind: FaultKind
    armed: Callable[[], bool]
    fired: int = 0
    _stuck: threading.Event = field(default_factory=threading.Event, repr=False)

    def delay(self, point: DelayPoint) -> None:
        kind = self.kind
        if point is DelayPoint.PREFILL and kind is FaultKind.PREFILL_RAISES and self.armed():
            self.fired += 1
            raise InjectedDeviceError("injected fault: the prefill program failed on the device")
        if point is DelayPoint.DECODE and kind is FaultKind.DECODE_RAISES and self.armed():
            self.fired += 1
            raise InjectedDeviceError("injected fault: the decode program failed on the device")
        if point is DelayPoint.READBACK and kind is FaultKind.READBACK_HANGS and self.armed():
            self.fired += 1
            self._stuck.wait()  # never set: this readback never completes

    def readback(self, value: object) -> object:
        if self.kind is FaultKind.READBACK_GARBAGE and self.armed():
            self.fired += 1
            return GARBAGE
        return value


def arm_file(path: Path) -> Callable[[], bool]:
    """Armed once ``path`` exists (one ``stat`` per hook call: test support only)."""
    return lambda: path.exists()


def from_env() -> DeviceFault:
    """The fault ``TT_TEST_DEVICE_FAULT`` names, armed by ``TT_TEST_DEVICE_FAULT_ARM``."""
    return DeviceFault(FaultKind(os.environ[KIND_ENV]), arm_file(Path(os.environ[ARM_ENV])))


def server_env(kind: FaultKind, arm: Path, testing_dir: Path) -> dict[str, str]:
    """Environment of a ``vllm serve`` whose host device carries ``kind``, armed by ``arm``."""
    path = os.pathsep.join(p for p in (str(testing_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {"TT_HOST_FAULTS": FACTORY, KIND_ENV: kind.value, ARM_ENV: str(arm), "PYTHONPATH": path}
