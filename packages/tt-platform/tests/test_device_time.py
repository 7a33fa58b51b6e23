"""Modelled device time: the ``host_device_time`` option, the cost model, and the host command
queue that runs programs on the device's own thread (time faked: no real waiting is asserted)."""

from __future__ import annotations

import threading

import pytest
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.faults import DelayPoint
from vllm_tt_platform.host.command_queue import CommandQueue, DeviceEvent
from vllm_tt_platform.host.device import HostDeviceOptions, HostMeshDevice
from vllm_tt_platform.host.device_time import (
    CHIPS,
    MODEL_PROFILES,
    SERVED,
    DeviceTimeSpec,
    MeshCost,
    ModelDims,
    parse_device_time,
)
from vllm_tt_platform.mesh.shape import MESH_PRESETS, MeshShape
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


@pytest.mark.parametrize(("text", "spec"), [
    ("25ms", DeviceTimeSpec(fixed_s=0.025)),
    ("800us", DeviceTimeSpec(fixed_s=800e-6)),
    ("0.04s", DeviceTimeSpec(fixed_s=0.04)),
    (" 0ms ", DeviceTimeSpec(fixed_s=0.0)),
    ("served", DeviceTimeSpec(model=SERVED)),
    ("llama-3.1-8b", DeviceTimeSpec(model="llama-3.1-8b")),
    ("Llama-3.3-70B@tg", DeviceTimeSpec(model="llama-3.3-70b", mesh_preset="TG")),
    ("served@n300", DeviceTimeSpec(model=SERVED, mesh_preset="N300")),
])
def test_device_time_forms(text, spec):
    assert parse_device_time(text) == spec


@pytest.mark.parametrize(("text", "named"), [
    ("fast", "unknown model 'fast'"),
    ("llama@N150", "unknown model 'llama'"),
    ("llama-3.1-8b@N999", "unknown mesh preset 'N999'"),
    ("25 minutes", "unknown model"),
])
def test_bad_device_time_names_the_accepted_forms(text, named):
    with pytest.raises(ValueError, match=named) as info:
        parse_device_time(text)
    assert "llama-3.1-8b@N150" in str(info.value) or "N150" in str(info.value)


def test_config_option_is_checked_and_host_only():
    config = TTConfig.from_sources({"mesh_backend": "host", "host_device_time": "llama-3.1-8b@N150",
                                    "host_skip_math": "true"}, environ={})
    assert config.host_device_time == "llama-3.1-8b@N150" and config.host_skip_math
    assert TTConfig.from_sources({"mesh_backend": "host"}, environ={}).host_device_time is None
    with pytest.raises(TTConfigError, match=r"--additional-config\.tt\.host_device_time='soon'"):
        TTConfig.from_sources({"mesh_backend": "host", "host_device_time": "soon"}, environ={})
    for key, value in (("host_device_time", "25ms"), ("host_skip_math", True)):
        with pytest.raises(TTConfigError, match=f"{key}.*mesh_backend host"):
            TTConfig.from_sources({"mesh_backend": "ttnn", key: value}, environ={})


def test_cost_model_orders_of_magnitude():
    """Decode streams the weights once per step: ~40 ms for 8B on one Wormhole, ~14 ms for 70B
    on a 32-chip Galaxy (collectives included)."""
    n150 = parse_device_time("llama-3.1-8b@N150").resolve(TINY, MeshShape(1, 1), None)
    tg = parse_device_time("llama-3.3-70b@TG").resolve(TINY, MeshShape(1, 1), None)
    assert 0.030 < n150.decode_s(0) < 0.050
    assert 0.010 < tg.decode_s(0) < 0.020
    dims = MODEL_PROFILES["llama-3.1-8b"]
    assert 7.9e9 < dims.streamed_params + dims.vocab_size * dims.hidden_size < 8.1e9  # 8.03B parameters
    mesh = n150.mesh
    expected = dims.streamed_params * 1.0625 / (CHIPS["wormhole"].dram_bytes_per_s * mesh.dram_efficiency)
    assert n150.decode_s(0) == pytest.approx(expected + mesh.program_overhead_s)
    # KV read grows a step; collectives only on multi-chip meshes.
    assert n150.decode_s(32 * 1024) - n150.decode_s(0) == pytest.approx(32 * 1024 * dims.kv_bytes_per_token / (
        CHIPS["wormhole"].dram_bytes_per_s * mesh.dram_efficiency))
    assert n150._collectives_s(dims, mesh) == 0 and tg._collectives_s(MODEL_PROFILES["llama-3.3-70b"], tg.mesh) > 0
    assert n150.prefill_s(256, 0) > 2 * n150.prefill_s(128, 0) - mesh.program_overhead_s
    assert n150.readback_s(4096) > n150.readback_s(0) > 0


def test_mesh_cost_follows_the_mesh():
    assert MeshCost.of_mesh(MESH_PRESETS["P150x4"], "P150x4").chip is CHIPS["blackhole"]
    assert MeshCost.of_mesh(MeshShape(1, 8), None) == MeshCost(chip=CHIPS["wormhole"], devices=8)
    served = DeviceTimeSpec(model=SERVED).resolve(TINY, MeshShape(1, 2), "N300")
    assert served.dims == TINY and served.mesh.devices == 2 and "N300" in served.description


def test_fixed_duration_applies_to_every_program():
    costs = parse_device_time("3ms").resolve(TINY, MeshShape(1, 1), None)
    assert costs.decode_s(10_000) == costs.prefill_s(4096, 100) == 0.003
    assert costs.readback_s(1 << 20) == 0.0


def test_model_dims_from_a_transformers_config():
    from transformers import LlamaConfig

    hf = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=500)
    dims = ModelDims.from_hf(hf)
    assert (dims.num_layers, dims.head_dim, dims.num_kv_heads, dims.vocab_size) == (3, 16, 2, 500)
    assert dims.layer_params == 64 * 16 * (8 + 4) + 3 * 64 * 96


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
