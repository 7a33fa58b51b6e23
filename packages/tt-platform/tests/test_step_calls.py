"""The step's device calls (``call_builder.StepCalls``, ``calls``): each kind's contract kwargs,
pinned to what the runner sent before the calls were typed, and every key a call sends is one
the model contract names for its member."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm_tt_models_registry.contract import CALLS, ROPE_DELTAS_KWARG, VERIFY_KWARG
from vllm_tt_platform.runner.batch import PersistentBatch
from vllm_tt_platform.runner.call_builder import StepCalls
from vllm_tt_platform.runner.calls import DecodeCall, PrefillCall, VerifyCall
from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout, LayerKV
from vllm_tt_platform.runner.mm_inputs import MultimodalInputError
from vllm_tt_platform.runner.model_output import ModelOutputError
from vllm_tt_platform.runner.step import ScheduledRow, StepPlan
from vllm_tt_platform.runner.step_results import MixedResult
from vllm_tt_sampling.decision import SamplingDecision, SamplingPath
from vllm_tt_sampling.params import TTSamplingParams
from vllm_tt_scheduler.phase import MixedStepError, Phase
from vllm_tt_testing.scheduler_outputs import cached_requests, new_request, scheduler_output

VOCAB = 512
KV = ("kv", (10, 2, 64, 32))
DEVICE = SamplingDecision(SamplingPath.DEVICE, "device")
HOST = SamplingDecision(SamplingPath.HOST, "test")
PENALISED = SamplingParams(max_tokens=8, temperature=0.0, presence_penalty=0.5)


def builder(num_slots: int = 4, *, uses_mrope: bool = False, layout: KVLayout | None = None) -> StepCalls:
    return StepCalls(kv_cache=KV, table_width=4, blocks_per_lane=10, layout=layout, num_slots=num_slots,
                     vocab_size=VOCAB, prefill_trace=True, decode_trace=True, uses_mrope=uses_mrope)


def lane_batch() -> tuple[PersistentBatch, StepPlan]:
    """Two lanes of two slots: ``a`` (penalties) in lane 0's first slot, ``b`` in lane 1's
    (block 12 is lane 1's local block 2); both prefilled, one token each; the prefill plan."""
    batch = PersistentBatch(lanes=2, rows_per_lane=2)
    out = scheduler_output([new_request("a", [5, 6, 7], [3], params=PENALISED), new_request("b", [8, 9], [12])],
                           scheduled={"a": 3, "b": 2})
    batch.update(out, {"a": 0, "b": 1})
    return batch, StepPlan.build(out, batch)


def decode_plan(batch: PersistentBatch) -> StepPlan:
    batch.requests["a"].output_token_ids.append(234)
    batch.requests["b"].output_token_ids.append(289)
    out = scheduler_output(cached=cached_requests(["a", "b"], [3, 2]), scheduled={"a": 1, "b": 1})
    batch.update(out)
    return StepPlan.build(out, batch)


def plain(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Tensors as ``(dtype, values)``, for comparing whole kwargs."""
    return {k: (v.dtype, v.tolist()) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def wire(**rows: list[Any]) -> TTSamplingParams:
    """Four wire rows: greedy slots' defaults, overridden per field."""
    base: dict[str, list[Any]] = {
        "temperature": [0.0] * 4, "top_k": [1] * 4, "top_p": [0.0, 1.0, 0.0, 1.0], "presence_penalty": [0.0] * 4,
        "frequency_penalty": [0.0] * 4, "repetition_penalty": [1.0] * 4, "seed": [None] * 4,
        "num_logprobs": [-2] * 4, "enable_log_probs": [False] * 4,
    }
    return TTSamplingParams(**{**base, **rows})


def test_a_lane_batch_decode_with_mrope_deltas_and_device_sampling_sends_what_the_runner_sent():
    batch, _ = lane_batch()
    batch.requests["a"].rope_delta, batch.requests["b"].rope_delta = -3, -4
    plan = decode_plan(batch)
    calls = builder(uses_mrope=True)
    call = calls.decode(plan, calls.sampling(plan, DEVICE), reset_batch=True)
    kwargs = call.to_contract_kwargs()
    assert list(kwargs) == ["tokens", "start_pos", "page_table", "kv_cache", "enable_trace", "read_from_device",
                            "reset_batch", "sampling_params", "prompt_tokens", "output_tokens", ROPE_DELTAS_KWARG]
    assert plain(kwargs) == {
        "tokens": (torch.int32, [[234], [0], [289], [0]]),
        "start_pos": (torch.int32, [3, -1, 2, -1]),
        "page_table": (torch.int32, [[3, 0, 0, 0], [0, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]),
        "kv_cache": KV, "enable_trace": True, "read_from_device": False, "reset_batch": True,
        "sampling_params": wire(presence_penalty=[0.5, 0.0, 0.0, 0.0]),
        "prompt_tokens": (torch.int32, [[5, 6, 7], [-1, -1, -1], [8, 9, -1], [-1, -1, -1]]),
        "output_tokens": (torch.int32, [[234], [-1], [289], [-1]]),
        ROPE_DELTAS_KWARG: [-3, 0, -4, 0],
    }


def test_device_sampling_says_what_keeps_a_decode_from_overlapping():
    batch, _ = lane_batch()
    plan = decode_plan(batch)
    penalised = builder().sampling(plan, DEVICE)
    assert penalised is not None and penalised.penalties and not penalised.logprobs
    batch.requests["a"].sampling_params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=1)
    logprobs = builder().sampling(plan, DEVICE)
    assert logprobs is not None and logprobs.logprobs and not logprobs.penalties
    assert set(logprobs.to_contract_kwargs()) == {"sampling_params"}


def test_a_host_sampled_decode_sends_neither_sampling_nor_reset_batch():
    batch, _ = lane_batch()
    plan = decode_plan(batch)
    calls = builder()
    assert calls.sampling(plan, HOST) is None
    kwargs = calls.decode(plan, None, reset_batch=None).to_contract_kwargs()
    assert list(kwargs) == ["tokens", "start_pos", "page_table", "kv_cache", "enable_trace", "read_from_device"]


def test_the_prefill_of_a_lane_batch_samples_in_call_order():
    _, plan = lane_batch()
    calls = builder()
    kwargs = calls.prefill(plan, calls.sampling(plan, DEVICE), prompt_logprobs=True).to_contract_kwargs()
    assert list(kwargs) == ["tokens", "page_table", "kv_cache", "prompt_lens", "start_pos", "empty_slots",
                            "enable_trace", "sampling_params", "prompt_tokens", "output_tokens"]
    assert plain(kwargs)["tokens"] == (torch.int32, [[5, 6, 7], [8, 9, 0]])
    assert kwargs["page_table"].tolist() == [[3, 0, 0, 0], [2, 0, 0, 0]]
    assert kwargs["empty_slots"] == [0, 2]
    assert kwargs["prompt_lens"].tolist() == [3, 2] and kwargs["start_pos"].tolist() == [0, 0]
    assert kwargs["sampling_params"].presence_penalty == [0.5, 0.0], "one wire row per call row, not per slot"
    assert kwargs["output_tokens"].tolist() == [[-1], [-1]]


def test_only_a_host_sampled_prefill_returns_all_logits_for_prompt_logprobs():
    _, plan = lane_batch()
    calls = builder()
    assert calls.prefill(plan, None, prompt_logprobs=True).to_contract_kwargs()["return_all_logits"] is True
    assert "return_all_logits" not in calls.prefill(plan, None, prompt_logprobs=False).to_contract_kwargs()
    device = calls.prefill(plan, calls.sampling(plan, DEVICE), prompt_logprobs=True)
    assert not device.return_all_logits and "return_all_logits" not in device.to_contract_kwargs()


def verify_plan() -> tuple[StepPlan, dict[str, list[int]]]:
    batch, _ = lane_batch()
    batch.requests["a"].sampling_params = SamplingParams(max_tokens=8, temperature=0.0)
    return decode_plan(batch), {"a": [110, 369, 214]}


def test_a_verify_call_sends_the_verify_shape_and_is_read_back_in_the_call():
    plan, drafts = verify_plan()
    calls = builder()
    call = calls.verify(plan, calls.sampling(plan, DEVICE), drafts, num_tokens=3)
    kwargs = call.to_contract_kwargs()
    assert list(kwargs) == ["tokens", "start_pos", "page_table", "kv_cache", "enable_trace", "read_from_device",
                            VERIFY_KWARG, "sampling_params"]
    assert plain(kwargs) == {
        "tokens": (torch.int32, [[234, 110, 369, 214], [0, 0, 0, 0], [289, 0, 0, 0], [0, 0, 0, 0]]),
        "start_pos": (torch.int32, [3, -1, 2, -1]),
        "page_table": (torch.int32, [[3, 0, 0, 0], [0, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]),
        "kv_cache": KV, "enable_trace": True, "read_from_device": True,
        VERIFY_KWARG: (torch.int32, [4, 0, 1, 0]),
        "sampling_params": wire(),
    }
    assert call.drafts == drafts
    host = calls.verify(plan, None, drafts, num_tokens=3).to_contract_kwargs()
    assert VERIFY_KWARG in host and "sampling_params" not in host, "logits for vLLM's rejection sampler"


def hybrid_layout() -> KVLayout:
    """A declared KV spec: one sliding-window group of both layers (per-layer tables)."""
    shape = (10, 2, 64, 16)
    return KVLayout((KVGroup(0, (0, 1), 64, 128, 127),),
                    (LayerKV(0, shape, torch.float32, 0), LayerKV(0, shape, torch.float32, 1)))


def every_call(calls: StepCalls, decision: SamplingDecision) -> list[PrefillCall | DecodeCall | VerifyCall]:
    batch, prefill = lane_batch()
    prefill_call = calls.prefill(prefill, calls.sampling(prefill, decision), prompt_logprobs=True)
    batch.requests["a"].rope_delta = -3
    decode = decode_plan(batch)
    decode_sampling = calls.sampling(decode, decision)
    reset = None if decode_sampling is None else True
    return [prefill_call, calls.decode(decode, decode_sampling, reset_batch=reset),
            calls.verify(decode, decode_sampling, {"a": [1, 2]}, num_tokens=3)]


@pytest.mark.parametrize("decision", [DEVICE, HOST], ids=["device", "host"])
@pytest.mark.parametrize("layout", [None, hybrid_layout()], ids=["one-table", "per-layer"])
def test_every_call_sends_only_what_the_contract_names(decision, layout):
    calls = builder(uses_mrope=True, layout=layout)
    for call, member in zip(every_call(calls, decision), ("prefill_forward", "decode_forward", "decode_forward"),
                            strict=True):
        shape = CALLS[member]
        kwargs = call.to_contract_kwargs()
        assert set(shape.keywords) <= set(kwargs), f"{type(call).__name__} lacks what {member} always gets"
        assert set(kwargs) <= {*shape.keywords, *shape.sometimes}, f"{type(call).__name__} sends outside the contract"
        assert ("page_tables_per_layer" in kwargs) is (layout is not None)
        assert ("sampling_params" in kwargs) is (decision is DEVICE)


def image_row(keys: list[str]) -> StepPlan:
    """The prefill of one request whose one image's processor output has ``keys``."""
    batch = PersistentBatch(lanes=1, rows_per_lane=1)
    feature = SimpleNamespace(modality="image", data={k: SimpleNamespace(data=torch.ones(1)) for k in keys},
                              mm_position=SimpleNamespace(offset=0, length=1))
    state = batch.add("vl", [9, 9, 1], PENALISED, [[1]], 0, lane=0, mm_features=[feature])
    return StepPlan(Phase.PREFILL, [ScheduledRow(state, 3)])


def test_a_prefill_carries_its_rows_images_under_their_processor_keys():
    plan = image_row(["pixel_values", "image_grid_thw"])
    kwargs = builder(1).prefill(plan, None, prompt_logprobs=False).to_contract_kwargs()
    assert {"pixel_values", "image_grid_thw"} <= set(kwargs)
    assert kwargs["pixel_values"][0][0].tolist() == [1.0]


@pytest.mark.parametrize("key", ["tokens", "sampling_params", "page_tables_per_layer"])
def test_an_image_key_that_would_replace_a_prefill_argument_is_refused(key):
    plan = image_row(["pixel_values", key])
    with pytest.raises(MultimodalInputError, match=f"produced \\['{key}'\\], which prefill_forward already takes"):
        builder(1).prefill(plan, None, prompt_logprobs=False)


def mixed_plan(batch: PersistentBatch, mixed: bool = True) -> StepPlan:
    """``a`` and ``b`` decode while ``c`` (new, 5 prompt tokens) computes its first 3."""
    batch.requests["a"].output_token_ids.append(234)
    batch.requests["b"].output_token_ids.append(289)
    out = scheduler_output([new_request("c", [1, 2, 3, 4, 5], [13])], cached=cached_requests(["a", "b"], [3, 2]),
                           scheduled={"a": 1, "b": 1, "c": 3})
    batch.update(out, {"c": 1})
    return StepPlan.build(out, batch, mixed=mixed)


@pytest.mark.parametrize("layout", [None, hybrid_layout()], ids=["one-table", "per-layer"])
def test_a_mixed_call_sends_the_decode_rows_by_slot_and_the_chunk_as_one_prefill_row(layout):
    batch, _ = lane_batch()
    plan = mixed_plan(batch)
    assert plan.phase is Phase.MIXED and plan.chunk is not None and plan.chunk.state.req_id == "c"
    assert [r.state.req_id for r in plan.decode_rows] == ["a", "b"]
    kwargs = builder(layout=layout).mixed(plan).to_contract_kwargs()
    shape = CALLS["mixed_forward"]
    assert set(shape.keywords) <= set(kwargs) <= {*shape.keywords, *shape.sometimes}
    assert kwargs["start_pos"].tolist() == [3, -1, 2, -1]  # by slot: a in slot 0, b in slot 2
    assert kwargs["tokens"][:, 0].tolist() == [234, 0, 289, 0]
    assert kwargs["chunk_tokens"].tolist() == [[1, 2, 3]] and kwargs["chunk_start"] == 0
    assert kwargs["chunk_slot"] == 3 and kwargs["chunk_completes"] is False  # 2 prompt tokens to go
    assert kwargs["chunk_page_table"].tolist() == [[3, 0, 0, 0]]  # block 13: lane 1's local block 3
    assert ("chunk_page_tables_per_layer" in kwargs) is (layout is not None)
    with pytest.raises(MixedStepError, match="mixed steps are off"):
        mixed_plan(lane_batch()[0], mixed=False)  # a model without mixed steps


def test_a_mixed_result_is_the_decode_rows_then_the_completing_chunk():
    batch, _ = lane_batch()
    call = builder().mixed(mixed_plan(batch))
    decode = torch.randn(4, 1, VOCAB)
    assert torch.equal(MixedResult.read(object(), (decode, None), call).output.logits, decode[:, -1])
    completing = dataclasses.replace(call, chunk_completes=True)
    chunk = torch.randn(1, 1, VOCAB)
    both = MixedResult.read(object(), (decode, chunk), completing).output.logits
    assert both.shape == (5, VOCAB) and torch.equal(both[-1], chunk[0, -1])
    with pytest.raises(ModelOutputError, match="expected None"):
        MixedResult.read(object(), (decode, chunk), call)
    with pytest.raises(ModelOutputError, match=r"expected \(decode_logits, chunk_logits\)"):
        MixedResult.read(object(), decode, call)
