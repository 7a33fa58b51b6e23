"""A deliberately slow modelled warmup (2 s per program: 8 s in all) against an engine-ready
timeout of 5 s: the server still comes up, with no other timeout variable set, and its log lists
each captured trace shape and each warmup pass with its time, then the total.

This is also the tombstone of vLLM 0.33's startup: the engine warms up inside the startup
handshake, which waits as long as the engine process lives; VLLM_ENGINE_READY_TIMEOUT_S only
bounds the ready message that follows (vllm/v1/engine/core_client.py). If a vLLM release puts
warmup under a deadline, this test fails and the platform must set that deadline from the
expected warmup."""

from __future__ import annotations

import re

import pytest

from tests.e2e.helpers import serve

pytestmark = pytest.mark.e2e


def test_slow_warmup_outlasts_the_engine_ready_timeout_and_logs_each_shape(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_RPC_TIMEOUT", raising=False)
    log = tmp_path / "serve.log"
    args = ("--max-model-len", "256", "--max-num-seqs", "4", "--additional-config.tt.host_device_time", "2s")
    with serve(tiny_checkpoint("llama"), *args, env={"VLLM_ENGINE_READY_TIMEOUT_S": "5"}, log=log, timeout=600):
        pass
    text = log.read_text()
    captured = re.findall(r"TT warmup: captured trace (\S+) in (\d+\.\d+) s", text)
    assert {shape for shape, _ in captured} >= {"prefill[len=128,batch=1]", "decode[len=1,batch=4]"}
    assert all(float(seconds) >= 2.0 for _, seconds in captured)
    passes = re.findall(r"TT warmup: (prefill|decode) (compile|trace capture) \(.*\) in (\d+\.\d+) s", text)
    assert len(passes) == 4
    total = float(re.search(r"TT warmup done: 4 passes in (\d+\.\d+) s", text).group(1))
    assert total > 5.0  # longer than the engine-ready timeout
