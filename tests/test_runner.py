"""``TTModelRunner`` on its own: a recording fake of the TT model contract stands in for the
model, a real ``VllmConfig`` (built by the platform, as the engine builds it) and real vLLM
scheduler outputs drive it step by step. Each test checks what the model was sent and what the
runner handed back to the scheduler."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from vllm.config import VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm_tt_models_registry import RegisteredModel
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.mesh.shape import MeshRequest, MeshShape
from vllm_tt_platform.mesh.topology import Topology
from vllm_tt_platform.runner.model_runner import TTModelRunner
from vllm_tt_testing.kv_planning import plan_kv_cache
from vllm_tt_testing.scheduler_outputs import cached_requests, greedy, new_request, scheduler_output

MAX_MODEL_LEN = 256
BLOCK = 64
"""The platform's default block size: ``MAX_MODEL_LEN`` spans a 4-block table."""
TABLE = MAX_MODEL_LEN // BLOCK
NUM_BLOCKS = 10
"""KV blocks per lane handed to ``initialize_kv_cache``."""
MESH_DEVICE = object()
TT_METAL_KV_TOKENS = 131_072
"""The KV pool per lane tt-metal assumes for a model that does not say."""


def next_token(last: int, position: int, vocab: int) -> int:
    """The fake model's choice after token ``last`` at ``position``: deterministic, and
    different for a different row, token or position (so a row mix-up shows)."""
    return (last * 31 + position * 7 + 3) % vocab


class ContractRecorder:
    """The TT model contract's required members, recorded: every call's arguments are kept
    (tensors cloned) and each row's next token is ``next_token`` of its last input token and
    position, returned as peaked logits (or as the token when asked to sample on device)."""

    model_capabilities: ClassVar[dict[str, Any]] = {}

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _record(self, name: str, **kwargs: Any) -> None:
        self.calls.append((name, {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}))

    def called(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for member, kwargs in self.calls if member == name]

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: Any, max_batch_size: int, max_seq_len: int,
                              tt_data_parallel: int = 1, optimizations: str | None = None) -> ContractRecorder:
        model = cls(hf_config.vocab_size)
        model._record("initialize_vllm_model", mesh_device=mesh_device, max_batch_size=max_batch_size,
                      max_seq_len=max_seq_len, tt_data_parallel=tt_data_parallel, optimizations=optimizations)
        return model

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any, num_layers: int) -> Any:
        self._record("allocate_kv_cache", kv_cache_shape=kv_cache_shape, dtype=dtype, num_layers=num_layers)
        return ("kv", kv_cache_shape)

    def _answer(self, last: list[int], positions: list[int], sampling_params: Any) -> Any:
        chosen = [next_token(t, p, self.vocab) for t, p in zip(last, positions, strict=True)]
        if sampling_params is not None:
            return torch.tensor(chosen, dtype=torch.int64)
        logits = torch.zeros((len(chosen), 1, self.vocab))
        for row, token in enumerate(chosen):
            logits[row, 0, token] = 10.0
        return logits

    def prefill_forward(self, tokens: Any, page_table: Any, kv_cache: Any, prompt_lens: Any, start_pos: Any = None,
                        empty_slots: Any = None, sampling_params: Any = None, enable_trace: bool = False,
                        **kwargs: Any) -> Any:
        self._record("prefill_forward", tokens=tokens, page_table=page_table, kv_cache=kv_cache,
                     prompt_lens=np.copy(prompt_lens), start_pos=np.copy(start_pos), empty_slots=list(empty_slots),
                     sampling_params=sampling_params, enable_trace=enable_trace, **kwargs)
        lens = [int(n) for n in prompt_lens]
        return self._answer([int(tokens[i, n - 1]) for i, n in enumerate(lens)], [n - 1 for n in lens],
                            sampling_params)

    def decode_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, enable_trace: bool = False,
                       read_from_device: bool = True, sampling_params: Any = None, **kwargs: Any) -> Any:
        self._record("decode_forward", tokens=tokens, start_pos=start_pos, page_table=page_table, kv_cache=kv_cache,
                     enable_trace=enable_trace, read_from_device=read_from_device,
                     sampling_params=sampling_params, **kwargs)
        return self._answer(tokens[:, 0].tolist(), start_pos.tolist(), sampling_params)


class RecordingModel(ContractRecorder):
    """With the optional warmup members."""

    def warmup_model_prefill(self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool) -> None:
        self._record("warmup_model_prefill", kv_cache=kv_cache, enable_trace=enable_trace,
                     can_sample_on_device=can_sample_on_device)

    def warmup_model_decode(self, kv_cache: Any, enable_trace: bool, max_batch_size: int, num_blocks: int,
                            can_sample_on_device: bool) -> None:
        self._record("warmup_model_decode", kv_cache=kv_cache, enable_trace=enable_trace,
                     max_batch_size=max_batch_size, num_blocks=num_blocks,
                     can_sample_on_device=can_sample_on_device)


class DeviceSamplingModel(RecordingModel):
    model_capabilities: ClassVar[dict[str, Any]] = {"supports_sample_on_device": True}


class PooledModel(RecordingModel):
    """Declares its KV token pool (``get_max_tokens_all_users``)."""

    pool_tokens: ClassVar[int] = 1000
    pool_queries: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def get_max_tokens_all_users(cls, model_name: str, num_devices: int, tt_data_parallel: int,
                                 max_model_len: int, max_num_seqs: int) -> int:
        cls.pool_queries.append({"model_name": model_name, "num_devices": num_devices,
                                 "tt_data_parallel": tt_data_parallel, "max_model_len": max_model_len,
                                 "max_num_seqs": max_num_seqs})
        return cls.pool_tokens


@pytest.fixture(scope="module")
def vllm_config(tiny_checkpoint) -> VllmConfig:
    """The engine's config of the tiny Llama on the host backend (block size 64, 2 layers, 2 KV
    heads of 32, bf16); ``max_num_seqs`` 4 bounds the host sampler's slots."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(tiny_checkpoint("llama")), max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
        additional_config={"tt": {"mesh_backend": "host"}},
    ).create_engine_config()


def make_runner(vllm_config: VllmConfig, model_cls: type[ContractRecorder] = RecordingModel, *, lanes: int = 1,
                rows: int = 4, devices: int | None = None, load: bool = True, kv_blocks: int | None = NUM_BLOCKS,
                **tt: Any) -> TTModelRunner:
    """A runner serving ``model_cls`` on ``lanes`` x ``rows`` slots of a ``(1, devices)`` mesh,
    loaded and given ``kv_blocks`` blocks per lane unless told not to."""
    registered = RegisteredModel("TTFakeForCausalLM", f"{model_cls.__module__}:{model_cls.__name__}", "test")
    setup = TTSetup(
        config=TTConfig.from_sources({"mesh_backend": "host", **tt}, environ={}),
        model=registered,
        capabilities=registered.capabilities(),  # also checks the fake against the contract
        topology=Topology(MeshRequest(MeshShape(1, devices or lanes), "test"), lanes, rows),
    )
    runner = TTModelRunner(vllm_config, setup, MESH_DEVICE)
    if load:
        runner.load_model()
        if kv_blocks is not None:
            runner.initialize_kv_cache(plan_kv_cache(vllm_config, runner.kv_cache_spec(), kv_blocks))
    return runner


def recorded(runner: TTModelRunner) -> ContractRecorder:
    model = runner.model
    assert isinstance(model, ContractRecorder)
    return model


def run(runner: TTModelRunner, out: Any) -> ModelRunnerOutput:
    assert runner.execute_model(out) is None, "a scheduled step is sampled by sample_tokens()"
    result = runner.sample_tokens(None)
    assert isinstance(result, ModelRunnerOutput)
    return result


def sampled(result: ModelRunnerOutput) -> dict[str, list[int]]:
    return {req_id: list(result.sampled_token_ids[i]) for req_id, i in result.req_id_to_index.items()}


# -- prefill -------------------------------------------------------------------------------------
def test_prefill_sends_each_row_with_its_slot_lengths_and_lane_local_table(vllm_config):
    runner = make_runner(vllm_config)
    vocab = recorded(runner).vocab
    out = run(runner, scheduler_output(
        [new_request("a", [5, 6, 7], [3]), new_request("b", [8, 9], [1, 2])], scheduled={"a": 3, "b": 2},
    ))
    (call,) = recorded(runner).called("prefill_forward")
    assert call["tokens"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert call["tokens"].dtype == torch.int32
    assert call["prompt_lens"].tolist() == [3, 2] and call["start_pos"].tolist() == [0, 0]
    assert call["empty_slots"] == [0, 1]
    assert call["page_table"].shape == (2, TABLE) and call["page_table"].dtype == torch.int32
    assert call["page_table"].tolist() == [[3, 0, 0, 0], [1, 2, 0, 0]]
    assert call["kv_cache"] == ("kv", (NUM_BLOCKS, 2, BLOCK, 32))
    assert call["sampling_params"] is None, "no sample_on_device_mode: the host samples"
    assert call["enable_trace"] is True  # trace_mode all
    assert out.req_ids == ["a", "b"]
    assert sampled(out) == {"a": [next_token(7, 2, vocab)], "b": [next_token(9, 1, vocab)]}


def test_chunked_prefill_yields_no_token_until_its_last_chunk(vllm_config):
    runner = make_runner(vllm_config)
    vocab = recorded(runner).vocab
    prompt = list(range(100, 110))
    first = run(runner, scheduler_output([new_request("a", prompt, [4])], scheduled={"a": 6}))
    assert sampled(first) == {"a": []}
    last = run(runner, scheduler_output(cached=cached_requests(["a"], [6]), scheduled={"a": 4}))
    assert sampled(last) == {"a": [next_token(109, 9, vocab)]}
    chunk1, chunk2 = recorded(runner).called("prefill_forward")
    assert chunk1["tokens"].tolist() == [prompt[:6]] and chunk1["prompt_lens"].tolist() == [6]
    assert chunk2["tokens"].tolist() == [prompt], "a later chunk is sent with the tokens before it"
    assert chunk2["start_pos"].tolist() == [6] and chunk2["prompt_lens"].tolist() == [10]


def test_prefix_cached_prompt_starts_after_the_cached_tokens(vllm_config):
    runner = make_runner(vllm_config)
    prompt = list(range(1, 71))
    run(runner, scheduler_output([new_request("a", prompt, [5, 6], computed=64)], scheduled={"a": 6}))
    (call,) = recorded(runner).called("prefill_forward")
    assert call["start_pos"].tolist() == [64] and call["prompt_lens"].tolist() == [70]
    assert call["page_table"].tolist() == [[5, 6, 0, 0]]


# -- decode --------------------------------------------------------------------------------------
def test_decode_sends_the_full_fixed_batch_with_padding_rows(vllm_config):
    runner = make_runner(vllm_config)
    vocab = recorded(runner).vocab
    prefill = run(runner, scheduler_output(
        [new_request("a", [5, 6, 7], [3]), new_request("b", [8, 9], [1, 2])], scheduled={"a": 3, "b": 2},
    ))
    ta, tb = sampled(prefill)["a"][0], sampled(prefill)["b"][0]
    out = run(runner, scheduler_output(cached=cached_requests(["a", "b"], [3, 2]), scheduled={"a": 1, "b": 1}))
    (call,) = recorded(runner).called("decode_forward")
    assert call["tokens"].shape == (4, 1) and call["tokens"][:, 0].tolist() == [ta, tb, 0, 0]
    assert call["start_pos"].tolist() == [3, 2, -1, -1], "free slots are padding at position -1"
    assert call["page_table"].tolist() == [[3, 0, 0, 0], [1, 2, 0, 0], [0] * TABLE, [0] * TABLE]
    assert call["read_from_device"] is False and call["sampling_params"] is None
    assert sampled(out) == {"a": [next_token(ta, 3, vocab)], "b": [next_token(tb, 2, vocab)]}


def test_decode_rows_are_read_by_slot_not_by_scheduling_order(vllm_config):
    runner = make_runner(vllm_config)
    vocab = recorded(runner).vocab
    first = sampled(run(runner, scheduler_output(
        [new_request("a", [1, 2], [1]), new_request("b", [3, 4], [2]), new_request("c", [5, 6], [3])],
        scheduled={"a": 2, "b": 2, "c": 2},
    )))
    d = sampled(run(runner, scheduler_output([new_request("d", [7, 8, 9], [4])], scheduled={"d": 3},
                                             finished={"a"})))
    assert runner.batch.requests["d"].slot == 0, "d takes the slot a gave back"
    out = run(runner, scheduler_output(cached=cached_requests(["c", "d", "b"], [2, 3, 2]),
                                       scheduled={"c": 1, "d": 1, "b": 1}))
    (call,) = recorded(runner).called("decode_forward")
    assert call["tokens"][:, 0].tolist() == [d["d"][0], first["b"][0], first["c"][0], 0]
    assert call["start_pos"].tolist() == [3, 2, 2, -1]
    assert out.req_ids == ["c", "d", "b"]
    assert sampled(out) == {"c": [next_token(first["c"][0], 2, vocab)], "d": [next_token(d["d"][0], 3, vocab)],
                            "b": [next_token(first["b"][0], 2, vocab)]}


def test_lanes_place_requests_by_their_lane_numbered_blocks(vllm_config):
    runner = make_runner(vllm_config, lanes=2, rows=2)
    blocks = runner.num_blocks
    run(runner, scheduler_output([new_request("a", [1, 2], [2]), new_request("b", [3, 4], [blocks + 5])],
                                 scheduled={"a": 2, "b": 2}))
    assert (runner.batch.requests["a"].slot, runner.batch.requests["b"].slot) == (0, 2)
    (prefill,) = recorded(runner).called("prefill_forward")
    assert prefill["page_table"].tolist() == [[2, 0, 0, 0], [5, 0, 0, 0]], "block ids are sent lane-local"
    run(runner, scheduler_output(cached=cached_requests(["a", "b"], [2, 2]), scheduled={"a": 1, "b": 1}))
    (decode,) = recorded(runner).called("decode_forward")
    assert decode["start_pos"].tolist() == [2, -1, 2, -1]
    assert decode["page_table"][:, 0].tolist() == [2, 0, 5, 0]


# -- KV sizing -----------------------------------------------------------------------------------
def test_kv_spec_names_every_layer_with_the_models_heads(vllm_config):
    runner = make_runner(vllm_config, kv_blocks=None)
    specs = runner.kv_cache_spec()
    assert list(specs) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    spec = specs["model.layers.0.self_attn"]
    assert (spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype) == (BLOCK, 2, 32, torch.bfloat16)


def test_kv_blocks_default_to_tt_metals_pool_plus_a_block_per_row(vllm_config):
    runner = make_runner(vllm_config, rows=4, kv_blocks=None)
    wanted = -(-(TT_METAL_KV_TOKENS + 4 * BLOCK) // BLOCK) + 1
    assert runner.kv_blocks_wanted() == wanted
    page = next(iter(runner.kv_cache_spec().values())).page_size_bytes
    assert runner.kv_cache_bytes() == wanted * page * 2


def test_kv_blocks_follow_the_models_pool_per_lane(vllm_config):
    PooledModel.pool_queries.clear()
    runner = make_runner(vllm_config, PooledModel, lanes=2, rows=2, devices=4, kv_blocks=None)
    assert runner.kv_blocks_wanted() == -(-(1000 + 2 * BLOCK) // BLOCK) + 1  # 18 + the null block
    assert PooledModel.pool_queries == [{
        "model_name": vllm_config.model_config.model, "num_devices": 2, "tt_data_parallel": 2,
        "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 2,
    }]


def test_kv_blocks_never_fewer_than_one_full_length_table(vllm_config, monkeypatch):
    monkeypatch.setattr(PooledModel, "pool_tokens", 0)
    runner = make_runner(vllm_config, PooledModel, rows=1, kv_blocks=None)
    assert runner.kv_blocks_wanted() == TABLE + 1


def test_kv_cache_shape_is_per_lane_and_per_device(vllm_config):
    runner = make_runner(vllm_config, devices=4, kv_blocks=7)
    (call,) = recorded(runner).called("allocate_kv_cache")
    assert call == {"kv_cache_shape": (7, 1, BLOCK, 32), "dtype": torch.bfloat16, "num_layers": 2}
    assert runner.num_blocks == 7 and runner.table_width == TABLE


# -- penalties history and the sampling choice ---------------------------------------------------
def penalised(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, presence_penalty=0.5)


def test_device_sampling_sends_wire_params_and_returns_the_models_tokens(vllm_config):
    runner = make_runner(vllm_config, DeviceSamplingModel, sample_on_device_mode="all")
    vocab = recorded(runner).vocab
    out = run(runner, scheduler_output([new_request("a", [5, 6, 7], [1])], scheduled={"a": 3}))
    (call,) = recorded(runner).called("prefill_forward")
    assert call["sampling_params"] is not None and "prompt_tokens" not in call, "no penalties, no history"
    assert sampled(out) == {"a": [next_token(7, 2, vocab)]}
    run(runner, scheduler_output(cached=cached_requests(["a"], [3]), scheduled={"a": 1}))
    (decode,) = recorded(runner).called("decode_forward")
    assert decode["sampling_params"] is not None and decode["reset_batch"] is True


def test_penalties_history_is_minus_one_padded_per_row_and_per_slot(vllm_config):
    runner = make_runner(vllm_config, DeviceSamplingModel, sample_on_device_mode="all")
    out = sampled(run(runner, scheduler_output(
        [new_request("a", [5, 6, 7], [1], params=penalised()), new_request("b", [8, 9], [2], params=greedy())],
        scheduled={"a": 3, "b": 2},
    )))
    (prefill,) = recorded(runner).called("prefill_forward")
    assert prefill["prompt_tokens"].tolist() == [[5, 6, 7], [8, 9, -1]]
    assert prefill["output_tokens"].tolist() == [[-1], [-1]], "no outputs yet: one -1 column"
    assert prefill["prompt_tokens"].dtype == torch.int32
    second = sampled(run(runner, scheduler_output(cached=cached_requests(["a", "b"], [3, 2]),
                                                  scheduled={"a": 1, "b": 1})))
    run(runner, scheduler_output(cached=cached_requests(["a"], [4]), scheduled={"a": 1}))
    decode1, decode2 = recorded(runner).called("decode_forward")
    assert decode1["prompt_tokens"].tolist() == [[5, 6, 7], [8, 9, -1], [-1] * 3, [-1] * 3]
    assert decode1["output_tokens"].tolist() == [[out["a"][0]], [out["b"][0]], [-1], [-1]]
    assert decode2["prompt_tokens"].tolist() == [[5, 6, 7], [-1] * 3, [-1] * 3, [-1] * 3], (
        "a slot that is not decoding this step (b) is padding"
    )
    assert decode2["output_tokens"].tolist() == [[out["a"][0], second["a"][0]], [-1, -1], [-1, -1], [-1, -1]]


def test_a_row_the_device_cannot_sample_sends_the_batch_to_the_host(vllm_config):
    runner = make_runner(vllm_config, DeviceSamplingModel, sample_on_device_mode="all")
    biased = SamplingParams(max_tokens=8, temperature=0.0, logit_bias={11: 100.0})
    out = run(runner, scheduler_output(
        [new_request("a", [5, 6, 7], [1], params=biased), new_request("b", [8, 9], [2])],
        scheduled={"a": 3, "b": 2},
    ))
    (call,) = recorded(runner).called("prefill_forward")
    assert call["sampling_params"] is None, "the whole batch falls back to the host sampler"
    assert sampled(out)["a"] == [11], "the host sampler applied the logit bias"
    assert runner.sampling.stats.count("host", "logit_bias") == 1


def test_decode_only_mode_samples_prefill_on_the_host(vllm_config):
    runner = make_runner(vllm_config, DeviceSamplingModel, sample_on_device_mode="decode_only")
    vocab = recorded(runner).vocab
    first = sampled(run(runner, scheduler_output([new_request("a", [5, 6, 7], [1])], scheduled={"a": 3})))
    assert first == {"a": [next_token(7, 2, vocab)]}
    run(runner, scheduler_output(cached=cached_requests(["a"], [3]), scheduled={"a": 1}))
    (prefill,) = recorded(runner).called("prefill_forward")
    (decode,) = recorded(runner).called("decode_forward")
    assert prefill["sampling_params"] is None and decode["sampling_params"] is not None


def test_an_intermediate_chunk_is_never_sampled_on_device(vllm_config):
    runner = make_runner(vllm_config, DeviceSamplingModel, sample_on_device_mode="all")
    run(runner, scheduler_output([new_request("a", list(range(1, 11)), [1])], scheduled={"a": 6}))
    (call,) = recorded(runner).called("prefill_forward")
    assert call["sampling_params"] is None


# -- lifecycle -----------------------------------------------------------------------------------
def test_model_load_passes_the_topology(vllm_config):
    runner = make_runner(vllm_config, lanes=2, rows=2, kv_blocks=None)
    (call,) = recorded(runner).called("initialize_vllm_model")
    assert call == {"mesh_device": MESH_DEVICE, "max_batch_size": 4, "max_seq_len": MAX_MODEL_LEN,
                    "tt_data_parallel": 2, "optimizations": None}


def test_a_step_before_load_model_names_the_missing_call(vllm_config):
    runner = make_runner(vllm_config, load=False)
    with pytest.raises(RuntimeError, match=r"TTModelRunner\.load_model\(\) has not run"):
        runner.execute_model(scheduler_output([new_request("a", [1, 2], [1])], scheduled={"a": 2}))
    with pytest.raises(RuntimeError, match=r"load_model\(\) has not run: there is no model class yet"):
        runner.kv_blocks_wanted()
    with pytest.raises(RuntimeError, match=r"load_model\(\) has not run: there is no model yet"):
        _ = runner.model


def test_a_step_before_initialize_kv_cache_names_the_missing_call(vllm_config):
    runner = make_runner(vllm_config, kv_blocks=None)
    with pytest.raises(RuntimeError, match=r"TTModelRunner\.initialize_kv_cache\(\) has not run"):
        runner.execute_model(scheduler_output([new_request("a", [1, 2], [1])], scheduled={"a": 2}))
    with pytest.raises(RuntimeError, match=r"initialize_kv_cache\(\) has not run"):
        _ = runner.kv_cache


def test_warm_up_compiles_then_captures_the_trace_modes_traces(vllm_config):
    runner = make_runner(vllm_config, DeviceSamplingModel, sample_on_device_mode="decode_only",
                         trace_mode="decode_only")
    runner.warm_up()
    model = recorded(runner)
    assert [(c["enable_trace"], c["can_sample_on_device"]) for c in model.called("warmup_model_prefill")] == [
        (False, False), (False, False)]
    assert [(c["enable_trace"], c["can_sample_on_device"], c["max_batch_size"], c["num_blocks"])
            for c in model.called("warmup_model_decode")] == [(False, True, 4, TABLE), (True, True, 4, TABLE)]



def test_warm_up_of_a_model_without_warmups_names_the_setting(vllm_config):
    with pytest.raises(TypeError, match=r"enable_model_warmup false"):
        make_runner(vllm_config, ContractRecorder).warm_up()
    make_runner(vllm_config, ContractRecorder, enable_model_warmup=False, trace_mode="none").warm_up()
