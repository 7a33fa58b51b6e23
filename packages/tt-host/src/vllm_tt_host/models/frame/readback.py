"""Device handles and readbacks of host models under modelled device time.

``decode_forward(read_from_device=False)`` returns a ``DecodeHandle`` while the program is in
flight; ``read_decode_output(handle, async_read=True)`` queues the device-to-host copy behind it
and returns ``(HostReadback, [event])``. Reading a ``HostReadback`` before its event was
synchronised is an error here (on hardware it would return whatever the buffer held), so a
runner that skips the wait fails loudly instead of racing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_tt_platform.cost.device_time import ProgramCosts

from vllm_tt_host.command_queue import CommandQueue, DeviceFuture


class DeviceReadError(RuntimeError):
    """A readback buffer was read before its event was synchronised."""


@dataclass(frozen=True)
class DecodeHandle:
    future: DeviceFuture
    sampled: bool
    rows: int
    vocab_size: int

    @property
    def nbytes(self) -> int:
        """Bytes the readback moves: int32 tokens plus float32 logprobs, or float32 logits."""
        return readback_nbytes(self.rows, self.vocab_size, sampled=self.sampled, logprobs=True)


def readback_nbytes(rows: int, vocab_size: int, *, sampled: bool, logprobs: bool, positions: int = 1) -> int:
    """Bytes a decode or verify output moves to the host, ``positions`` per row: an int32 token
    (plus a float32 logprob with ``logprobs``) when the device sampled, else float32 logits."""
    per_position = (4 + 4 * logprobs) if sampled else 4 * vocab_size
    return rows * positions * per_position


@dataclass(frozen=True)
class HostReadback:
    future: DeviceFuture

    def value(self) -> Any:
        if not self.future.done():
            raise DeviceReadError(
                "decode output read before its readback event was synchronised; call "
                "event_synchronize on every event read_decode_output returned first"
            )
        return self.future.result()


class DecodeReader:
    """The reader half of the decode contract (§3.4, §3.5) for models with a ``queue``
    (the mesh's ``CommandQueue``) and ``costs`` (``ProgramCosts`` or None)."""

    queue: CommandQueue
    costs: ProgramCosts | None

    def read_decode_output(self, tt_out: Any, async_read: bool = False) -> tuple[Any, list[Any]]:
        """Start the device-to-host copy of one decode submission: ``(host_out, events)``.
        ``host_out`` may be read once every event was synchronised; without ``async_read``
        the copy has completed on return (and there are no events)."""
        if not isinstance(tt_out, DecodeHandle):
            return tt_out, []
        readback = start_readback(tt_out, self.queue, self.costs)
        if not async_read:
            readback.future.result()
            return readback, []
        return readback, [readback.future.event]

    def process_decode_output_host(self, tt_out: Any, is_tokens: bool = False) -> Any:
        """Host tensors of a decode handle (read now), of a synchronised readback, or of host
        output: tokens ``[B]`` or ``(tokens, logprobs)``, or logits ``[B, 1, V]``."""
        return host_value(tt_out, self.queue, self.costs)


def start_readback(handle: DecodeHandle, queue: CommandQueue, costs: ProgramCosts | None) -> HostReadback:
    duration = costs.readback_s(handle.nbytes) if costs is not None else 0.0
    return HostReadback(queue.submit(handle.future.result, duration, readback=True))


def host_value(out: Any, queue: CommandQueue, costs: ProgramCosts | None) -> Any:
    """Host tensors of a handle (blocking read, the sync path), a readback or host output."""
    if isinstance(out, DecodeHandle):
        return start_readback(out, queue, costs).future.result()
    if isinstance(out, HostReadback):
        return out.value()
    return out
