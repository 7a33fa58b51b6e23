"""Modelled device time on the host device: the command queue that runs programs on the device's
own thread (time faked: no real waiting is asserted), and the device's time options."""

from __future__ import annotations

import threading

import pytest
from vllm_tt_host.command_queue import CommandQueue, DeviceEvent
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice
from vllm_tt_platform.cost.device_time import ModelDims, parse_device_time
from vllm_tt_platform.faults import DelayPoint
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.faults import ScriptedFaults

TINY = ModelDims(2, 128, 256, 4, 2, 32, 1024, tied_embeddings=True)


class FakeClock:
    """A clock that only moves when the device sleeps or a program says it computed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_timed_queue_runs_in_order_and_waits_out_the_modelled_duration():
    clock = FakeClock()
    queue = CommandQueue(timed=True, clock=clock, sleep=clock.sleep)
    ran: list[tuple[str, str]] = []

    def program(name: str, compute_s: float):
        def run():
            clock.now += compute_s
            ran.append((name, threading.current_thread().name))
            return name
        return run

    futures = [queue.submit(program("a", 0.003), 0.010), queue.submit(program("b", 0.020), 0.010),
               queue.submit(program("c", 0.0), 0.0, readback=True)]
    assert [f.result() for f in futures] == ["a", "b", "c"]
    assert ran == [("a", "tt-host-device"), ("b", "tt-host-device"), ("c", "tt-host-device")]
    assert clock.sleeps == [pytest.approx(0.007)]  # b computed longer than its duration; c is free
    assert (queue.stats.programs, queue.stats.readbacks) == (2, 1)
    assert queue.stats.busy_s == pytest.approx(0.030)
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        queue.submit(lambda: None)


def test_queue_errors_reach_the_reader_and_readbacks_pass_the_fault_point():
    queue = CommandQueue(timed=True, clock=FakeClock(), sleep=lambda s: None)
    faults = ScriptedFaults()
    queue.faults = faults

    def broken():
        raise ValueError("bad program")

    failed = queue.submit(broken, 0.0)
    copied = queue.submit(lambda: 7, 0.0, readback=True)
    with pytest.raises(ValueError, match="bad program"):
        failed.result()
    assert copied.result() == 7 and copied.event.recorded
    assert faults.events == [(DelayPoint.READBACK, 0)]
    queue.close()


def test_untimed_queue_runs_on_the_callers_thread():
    queue = CommandQueue(timed=False)
    future = queue.submit(lambda: threading.current_thread().name, 5.0)
    assert future.done() and future.result() == threading.current_thread().name
    queue.close()


def test_host_mesh_device_time_options():
    plain = HostMeshDevice(MeshShape(1, 1))
    assert plain.program_costs(TINY) is None and not plain.command_queue.deferred and not plain.skip_math
    timed = HostMeshDevice(MeshShape(8, 4), options=HostDeviceOptions(
        device_time=parse_device_time("served"), skip_math=True, preset="TG"))
    costs = timed.program_costs(TINY)
    assert costs.mesh.devices == 32 and costs.dims == TINY and timed.skip_math
    lanes = timed.create_submeshes(4)
    assert all(lane.command_queue is timed.command_queue for lane in lanes)
    event = DeviceEvent()
    event.record()
    timed.event_synchronize(event)
    with pytest.raises(TypeError, match="event recorded by this host device"):
        timed.event_synchronize(object())
    timed.command_queue.submit(lambda: None).result()
    timed.close()
    assert timed.command_queue._thread is None
