"""Device-side verification of verify steps (speculative decoding), through ``TTModelRunner``: with
device sampling on and every row greedy, ``decode_forward`` is called in the contract's
device-sampling verify mode (``sampling_params`` with ``VERIFY_KWARG``) and only argmax tokens
come back; a sampled row sends the step to the host's rejection sampler; a row that blocks
drafts makes the step a plain decode step. Each decision is counted in the sampling stats."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from vllm.config import VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm_tt_models_registry import RegisteredModel
from vllm_tt_models_registry.contract import CALLS, VERIFY_KWARG
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.mesh.shape import MeshRequest, MeshShape
from vllm_tt_platform.mesh.topology import Topology
from vllm_tt_platform.runner.model_runner import TTModelRunner
from vllm_tt_testing.kv_planning import plan_kv_cache
from vllm_tt_testing.scheduler_outputs import cached_requests, new_request, scheduler_output

K = 3
ROWS = 4


def target(last: int, position: int, vocab: int) -> int:
    """The fake model's token after ``last`` at ``position`` (differs per token and position)."""
    return (last * 31 + position * 7 + 3) % vocab


class VerifyingModel:
    """The contract's required members with verify steps, recorded: the target after each position
    as peaked logits, or as argmax tokens when sent ``sampling_params``."""

    model_capabilities: ClassVar[dict[str, Any]] = {"supports_sample_on_device": True,
                                                    "supports_verify_decode": True}

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.decode_calls: list[dict[str, Any]] = []

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: Any, max_batch_size: int, max_seq_len: int,
                              tt_data_parallel: int = 1, optimizations: str | None = None) -> VerifyingModel:
        return cls(hf_config.vocab_size)

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any, num_layers: int) -> Any:
        return "kv"

    def _answer(self, tokens: torch.Tensor, start: list[int], sampling_params: Any) -> torch.Tensor:
        chosen = torch.tensor([[target(int(t), p + j, self.vocab) for j, t in enumerate(row)]
                               for row, p in zip(tokens.tolist(), start, strict=True)])
        if sampling_params is not None:
            return chosen
        return torch.nn.functional.one_hot(chosen, self.vocab).float() * 10.0

    def prefill_forward(self, tokens: Any, page_table: Any, kv_cache: Any, prompt_lens: Any, start_pos: Any = None,
                        empty_slots: Any = None, sampling_params: Any = None, enable_trace: bool = False,
                        **kwargs: Any) -> Any:
        lens = [int(n) for n in prompt_lens]
        last = torch.tensor([[int(tokens[i, n - 1])] for i, n in enumerate(lens)])
        out = self._answer(last, [n - 1 for n in lens], sampling_params)
        return out[:, 0] if sampling_params is not None else out

    def decode_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, enable_trace: bool = False,
                       read_from_device: bool = True, sampling_params: Any = None, **kwargs: Any) -> Any:
        self.decode_calls.append({"tokens": tokens.clone(), "start_pos": start_pos.clone(), "page_table": page_table,
                                  "kv_cache": kv_cache, "enable_trace": enable_trace,
                                  "read_from_device": read_from_device, "sampling_params": sampling_params,
                                  **kwargs})
        out = self._answer(tokens, start_pos.tolist(), sampling_params)
        if VERIFY_KWARG in kwargs:
            return out
        return out[:, 0] if sampling_params is not None else out[:, :1]


@pytest.fixture(scope="module")
def vllm_config(tiny_checkpoint) -> VllmConfig:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(tiny_checkpoint("llama")), max_model_len=256, max_num_seqs=ROWS,
        speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1},
        additional_config={"tt": {"mesh_backend": "host"}},
    ).create_engine_config()


def make_runner(vllm_config: VllmConfig) -> TTModelRunner:
    registered = RegisteredModel("TTFakeForCausalLM", f"{__name__}:VerifyingModel", "test")
    setup = TTSetup(
        config=TTConfig.from_sources({"mesh_backend": "host", "sample_on_device_mode": "all"}, environ={}),
        model=registered, capabilities=registered.capabilities(),
        topology=Topology(MeshRequest(MeshShape(1, 1), "test"), 1, ROWS),
    )
    runner = TTModelRunner(vllm_config, setup, object())
    runner.load_model()
    runner.initialize_kv_cache(plan_kv_cache(vllm_config, runner.kv_cache_spec(), 10))
    return runner


def run(runner: TTModelRunner, out: Any) -> dict[str, list[int]]:
    assert runner.execute_model(out) is None
    result = runner.sample_tokens(None)
    assert isinstance(result, ModelRunnerOutput)
    return {req_id: list(result.sampled_token_ids[i]) for req_id, i in result.req_id_to_index.items()}


def verify_step(runner: TTModelRunner, params: SamplingParams, drafts_right: int) -> tuple[list[int], list[int]]:
    """Prefill ``a`` (with ``params``) and greedy ``b``, then one step where ``a`` carries K drafts,
    the first ``drafts_right`` of them the target's; ``a``'s drafts and tokens of that step."""
    vocab = runner.model.vocab  # type: ignore[attr-defined]
    first = run(runner, scheduler_output([new_request("a", [5, 6, 7], [1], params=params),
                                          new_request("b", [8, 9], [2])], scheduled={"a": 3, "b": 2}))
    last, drafts = first["a"][0], []
    for j in range(K):
        right = target(last, 3 + j, vocab)
        drafts.append(right if j < drafts_right else (right + 1) % vocab)
        last = drafts[-1]
    out = scheduler_output(cached=cached_requests(["a", "b"], [3, 2]), scheduled={"a": 1 + K, "b": 1 + K})
    out.scheduled_spec_decode_tokens = {"a": drafts, "b": [-1] * K}
    return drafts, run(runner, out)["a"]


def test_a_greedy_verify_step_is_verified_on_device_from_argmax_tokens(vllm_config):
    runner = make_runner(vllm_config)
    vocab = runner.model.vocab  # type: ignore[attr-defined]
    drafts, tokens = verify_step(runner, SamplingParams(temperature=0.0), drafts_right=2)
    assert tokens == [*drafts[:2], target(drafts[1], 5, vocab)]  # two kept, then the correction
    (call,) = runner.model.decode_calls  # type: ignore[attr-defined]
    shape = CALLS["decode_forward"]  # the call is one the contract lists
    assert set(shape.keywords) <= set(call) and set(call) - set(shape.keywords) <= set(shape.sometimes)
    assert call[VERIFY_KWARG].tolist() == [1 + K, 1, 0, 0]
    assert call["tokens"].shape == (ROWS, 1 + K)
    assert call["sampling_params"] is not None, runner.sampling.stats.as_dict()
    assert list(call["sampling_params"].temperature) == [0.0] * ROWS and call["read_from_device"] is True
    assert runner.sampling.stats.as_dict() == {"device": 1, "device:verify": 1}


def test_a_sampled_row_sends_the_verify_step_to_the_host(vllm_config):
    runner = make_runner(vllm_config)
    drafts, tokens = verify_step(runner, SamplingParams(temperature=0.7, top_k=5), drafts_right=K)
    (call,) = runner.model.decode_calls  # type: ignore[attr-defined]
    assert call["sampling_params"] is None and VERIFY_KWARG in call  # logits for the rejection sampler
    assert 1 <= len(tokens) <= 1 + K
    assert runner.sampling.stats.as_dict() == {"device": 1, "host:verify_sampled": 1}


def test_a_row_blocking_drafts_makes_the_step_a_plain_decode_step(vllm_config):
    runner = make_runner(vllm_config)
    vocab = runner.model.vocab  # type: ignore[attr-defined]
    first_token = target(7, 2, vocab)
    drafts, tokens = verify_step(runner, SamplingParams(temperature=0.0, repetition_penalty=1.2), drafts_right=K)
    (call,) = runner.model.decode_calls  # type: ignore[attr-defined]
    assert VERIFY_KWARG not in call and call["tokens"].shape == (ROWS, 1)
    assert call["sampling_params"] is not None  # a plain decode samples on device (penalties declared)
    assert tokens == [target(first_token, 3, vocab)]
    assert runner.sampling.stats.as_dict() == {"device": 2}
