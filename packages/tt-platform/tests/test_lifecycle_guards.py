"""State that exists only after a lifecycle step is reached through a property that says which
step has not run, instead of failing later on ``None``."""

from __future__ import annotations

import pytest
from vllm_tt_platform.runner.model_runner import TTModelRunner
from vllm_tt_platform.runner.sampling.step_sampling import StepSampling
from vllm_tt_platform.worker import TTWorker


def test_worker_runner_before_init_device():
    worker = object.__new__(TTWorker)
    worker._runner = None
    with pytest.raises(RuntimeError, match=r"init_device\(\) has not run"):
        _ = worker.runner
    worker._runner = runner = object.__new__(TTModelRunner)
    assert worker.runner is runner


def test_runner_host_sampler_before_load_model():
    sampling = object.__new__(StepSampling)
    sampling._host = None
    with pytest.raises(RuntimeError, match=r"load_model\(\) has not run"):
        _ = sampling.host_sampler


def test_runner_speculation_without_a_speculative_config():
    runner = object.__new__(TTModelRunner)
    runner._spec = None
    with pytest.raises(RuntimeError, match=r"--speculative-config is not set"):
        _ = runner.speculation
