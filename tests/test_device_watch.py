"""Device faults below the engine: a failing or hung device call becomes one ``TTDeviceError``
in bounded time (the end-to-end behaviour is tests/e2e/test_device_faults.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from vllm_tt_host.command_queue import CommandQueue
from vllm_tt_host.fault_loader import load_faults
from vllm_tt_platform.errors import TTConfigError, TTDeviceError, TTReadbackTimeoutError
from vllm_tt_platform.faults import DelayPoint, Faults
from vllm_tt_platform.runner import model_output
from vllm_tt_platform.runner.device_watch import DeviceWatch
from vllm_tt_testing.device_faults import GARBAGE, DeviceFault, FaultKind, InjectedDeviceError


def test_a_readback_that_never_completes_times_out_with_the_option_named():
    never = threading.Event()
    watch = DeviceWatch(readback_timeout_s=0.2)
    start = time.monotonic()
    with pytest.raises(TTReadbackTimeoutError, match=r"decode readback failed: it did not complete within "
                       r"--additional-config.tt.readback_timeout_s=0.2 s.*Fix: check the device"):
        watch.read("decode readback", never.wait)
    assert time.monotonic() - start < 2
    never.set()
    assert watch.read("decode readback", lambda: 7) == 7  # the watcher thread serves the next read


def test_a_failing_device_call_is_one_device_error_naming_the_call_and_the_cause():
    watch = DeviceWatch(readback_timeout_s=5)
    with pytest.raises(TTDeviceError, match=r"TT device prefill step failed: InjectedDeviceError: boom\. The "
                       r"device state is unknown") as info, watch.call("prefill step"):
        raise InjectedDeviceError("boom")
    assert isinstance(info.value.__cause__, InjectedDeviceError)
    with pytest.raises(TTDeviceError, match="decode readback failed: ValueError: bad"):
        watch.read("decode readback", lambda: (_ for _ in ()).throw(ValueError("bad")))
    inner = TTReadbackTimeoutError("decode readback", 1)
    with pytest.raises(TTReadbackTimeoutError) as again, watch.call("decode step"):
        raise inner
    assert again.value is inner  # not wrapped twice


@pytest.mark.parametrize("raw", [GARBAGE, torch.zeros(5, dtype=torch.int64), torch.zeros(4, 1, 1, dtype=torch.int64)])
def test_device_tokens_of_the_wrong_shape_are_refused(raw):
    with pytest.raises(model_output.ModelOutputError, match=r"returned tokens of shape .*, expected \[4\]"):
        model_output.parse(raw, sampled_on_device=True, owner="M.decode_forward", rows=4)
    assert model_output.parse(torch.arange(4), sampled_on_device=True, owner="M", rows=4).tokens.tolist() == [0, 1, 2, 3]


def test_logits_of_the_wrong_row_count_are_refused():
    with pytest.raises(model_output.ModelOutputError, match=r"expected float logits \[4, S, V\]"):
        model_output.parse(torch.zeros(3, 1, 8), sampled_on_device=False, owner="M.decode_forward", rows=4)


def test_closing_a_device_stuck_in_an_operation_returns():
    stuck = threading.Event()
    queue = CommandQueue(timed=True)
    queue.submit(stuck.wait)
    start = time.monotonic()
    queue.close(timeout_s=0.2)
    assert time.monotonic() - start < 2
    stuck.set()


def test_an_armed_device_fault_fires_at_its_point_only():
    armed = [False]
    fault = DeviceFault(FaultKind.DECODE_RAISES, lambda: armed[0])
    fault.delay(DelayPoint.DECODE)
    armed[0] = True
    fault.delay(DelayPoint.PREFILL)
    assert fault.readback("tokens") == "tokens"
    with pytest.raises(InjectedDeviceError):
        fault.delay(DelayPoint.DECODE)
    assert DeviceFault(FaultKind.READBACK_GARBAGE, lambda: True).readback("tokens") is GARBAGE


def test_the_host_fault_hook_loads_a_factory_and_refuses_anything_else():
    assert isinstance(load_faults("vllm_tt_platform.faults:Faults"), Faults)
    for bad in ("no-colon", "vllm_tt_platform.faults:missing", "nowhere.at.all:x", "builtins:dict"):
        with pytest.raises(TTConfigError, match="TT_HOST_FAULTS"):
            load_faults(bad)
