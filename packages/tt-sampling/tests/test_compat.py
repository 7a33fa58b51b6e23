"""Tombstones for ``host.compat``, and the ``VllmConfig`` attributes the host sampler reads.

Each tombstone (``tests/tombstone.py``) records on which vLLM releases the behaviour that made a
workaround necessary exists; when one fails, vLLM changed, and the matching override in
``PortableSampler`` can probably be deleted.
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
from vllm.config import ModelConfig, SchedulerConfig, VllmConfig
from vllm.config.reasoning import ReasoningConfig
from vllm.v1.sample.ops import logprobs as vllm_logprobs
from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
from vllm.v1.sample.sampler import Sampler
from vllm_tt_sampling.host.compat import PortableSampler

from tests.tombstone import Tombstone

DIST = "vllm-tt-sampling"
SHIM = "vllm_tt_sampling.host.compat.PortableSampler"


def test_tombstone_vllm_ranks_are_torch_compiled():
    # PortableSampler.gather_logprobs exists because this helper is torch.compile-d with the
    # platform's backend (inductor by default, which needs a working compiler toolchain).
    Tombstone(f"{SHIM}.gather_logprobs", DIST).check(
        needed_here=hasattr(vllm_logprobs.batched_count_greater_than, "_torchdynamo_orig_callable")
    )


def test_tombstone_vllm_greedy_needs_compiled_ops():
    # PortableSampler.greedy_sample exists because CPU platforms route greedy argmax through
    # vLLM's compiled _C extension (from 0.32; 0.31 used plain argmax, so the override is a no-op).
    Tombstone(f"{SHIM}.greedy_sample", DIST, needed_from="0.32").check(
        needed_here="_C.greedy_argmax" in inspect.getsource(Sampler.greedy_sample)
    )


def test_tombstone_vllm_cpu_top_k_top_p_needs_compiled_code():
    # The pinned forward_native exists because vLLM's CPU top-k/top-p draw is compiled: a _C
    # kernel from 0.32, a torch.compile-d helper on 0.31.
    source = inspect.getsource(TopKTopPSampler.forward_cpu)
    Tombstone(f"{SHIM}.__init__ (forward_native pin)", DIST).check(
        needed_here="fused_gumbel_argmax" in source or "compiled_random_sample" in source
    )


def test_portable_sampler_uses_plain_torch_paths():
    sampler = PortableSampler()
    # The top-k/top-p step goes through the counter-stream hook, which defers to forward_native.
    assert sampler.topk_topp_sampler.forward == sampler._top_k_top_p
    assert sampler._native == sampler.topk_topp_sampler.forward_native
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 5.0]])
    assert sampler.greedy_sample(logits).tolist() == [1, 2]


def test_config_attributes_read_by_host_sampler_exist():
    # The unit tests pass a stand-in with only these attributes (see test_host_batch.py).
    assert {"scheduler_config", "model_config", "speculative_config", "reasoning_config"} <= {
        f.name for f in dataclasses.fields(VllmConfig)
    }
    # What vLLM's thinking-budget holder reads from the reasoning config (the tests' stand-in).
    assert isinstance(ReasoningConfig.reasoning_start_token_ids, property)
    assert isinstance(ReasoningConfig.reasoning_end_token_ids, property)
    assert {"logits_processors", "logprobs_mode"} <= {f.name for f in dataclasses.fields(ModelConfig)}
    assert "max_num_seqs" in {f.name for f in dataclasses.fields(SchedulerConfig)}
