"""The runner's sampling outputs: prompt logprobs over chunked prefill, device-sampled tokens
and logprobs, host-sampled rows in output order, device sampling inputs, the sampling trace."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm_tt_platform.envs import TT_SAMPLING_TRACE
from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.model_output import ModelOutput, ModelOutputError, is_host_output, parse
from vllm_tt_platform.runner.sampling.inputs import DeviceSampling
from vllm_tt_platform.runner.sampling.output import (
    UNKNOWN_RANK,
    PromptLogprobs,
    from_device,
    from_host,
    positions,
)
from vllm_tt_platform.runner.sampling.trace import (
    JsonlSamplingTrace,
    NullSamplingTrace,
    open_sampling_trace,
)
from vllm_tt_platform.runner.step import ScheduledRow
from vllm_tt_sampling.decision import SamplingDecision, SamplingPath
from vllm_tt_sampling.host import HostSamplingBatch, SeedStream

VOCAB = 16


def state(req_id: str, prompt: list[int], computed: int = 0, slot: int = 0, **params) -> RequestState:
    return RequestState(req_id, slot, list(prompt), SamplingParams(max_tokens=8, **params), [[1]], computed)


def chunk(s: RequestState, end: int) -> ScheduledRow:
    """The row computing ``[s.num_computed_tokens, end)``."""
    return ScheduledRow(s, end - s.num_computed_tokens)


def right_aligned(rows: list[ScheduledRow], tables: list[torch.Tensor]) -> torch.Tensor:
    """``[B, T, V]`` as a model returns it for ``return_all_logits``: row i's computed positions
    (looked up in ``tables[i] [positions, V]``) right-aligned."""
    spans = [(r.state.num_computed_tokens, r.end) for r in rows]
    width = max(end - start for start, end in spans)
    out = torch.full((len(rows), width, VOCAB), float("nan"))
    for i, (start, end) in enumerate(spans):
        out[i, width - (end - start):] = tables[i][start:end]
    return out


def expected_prompt_logprobs(table: torch.Tensor, prompt: list[int], n: int):
    lp = table[: len(prompt) - 1].log_softmax(-1)
    targets = torch.tensor(prompt[1:])
    top = lp.topk(n, dim=-1)
    picked = lp.gather(1, targets[:, None])
    ranks = (lp >= picked).sum(-1)
    return torch.cat((targets[:, None], top.indices), 1), torch.cat((picked, top.values), 1), ranks


# --- prompt logprobs ------------------------------------------------------------------------------


def test_prompt_logprobs_accumulate_over_chunks_and_are_handed_over_once():
    prompt = [3, 9, 4, 4, 12, 1, 7, 8, 2, 5]
    other = [6, 6, 6]
    table = torch.randn(len(prompt), VOCAB, generator=torch.Generator().manual_seed(0))
    other_table = torch.randn(len(other), VOCAB, generator=torch.Generator().manual_seed(1))
    tracker = PromptLogprobs(VOCAB)
    asked, plain = state("a", prompt, prompt_logprobs=2), state("b", other, slot=1)
    tracker.add("a", asked.sampling_params, prompt)
    tracker.add("b", plain.sampling_params, other)

    # Chunk 1 [0, 4) next to a short unrelated prompt; chunk 2 ends at len-1 (the "==" case:
    # every prompt logprob is known, but the request samples nothing yet); chunk 3 samples.
    for end, finished in ((4, False), (9, False), (10, True)):
        rows = [chunk(asked, end)] + ([chunk(plain, 3)] if end == 4 else [])
        assert tracker.wanted(rows)
        tracker.collect(rows, right_aligned(rows, [table, other_table]))
        done = tracker.take_done()
        assert list(done) == (["a"] if finished else [])
        asked.num_computed_tokens = end

    ids, values, ranks = expected_prompt_logprobs(table, prompt, 2)
    assert done["a"].logprob_token_ids.tolist() == ids.tolist()
    torch.testing.assert_close(done["a"].logprobs, values)
    assert done["a"].selected_token_ranks.tolist() == ranks.tolist()
    assert not tracker.wanted([chunk(asked, 10)])  # handed over: resumed prefills need nothing


def test_prompt_logprobs_only_for_requests_that_ask():
    tracker = PromptLogprobs(VOCAB)
    s = state("x", [1, 2, 3])
    tracker.add("x", s.sampling_params, [1, 2, 3])
    assert not tracker.wanted([chunk(s, 3)])


def test_prompt_logprobs_minus_one_means_the_whole_vocabulary_and_drop_forgets():
    tracker = PromptLogprobs(VOCAB)
    s = state("x", [1, 2, 3], prompt_logprobs=-1)
    tracker.add("x", s.sampling_params, [1, 2, 3])
    table = torch.randn(3, VOCAB)
    tracker.collect([chunk(s, 3)], right_aligned([chunk(s, 3)], [table]))
    assert tracker.take_done()["x"].logprobs.shape == (2, VOCAB + 1)
    tracker.add("y", s.sampling_params, [1, 2, 3])
    tracker.drop("y")
    assert not tracker.wanted([ScheduledRow(state("y", [1, 2, 3]), 3)])


def test_prompt_logprobs_in_logits_mode_are_raw_logits():
    tracker = PromptLogprobs(VOCAB, logprobs_mode="raw_logits")
    s = state("x", [1, 2, 3], prompt_logprobs=0)
    tracker.add("x", s.sampling_params, [1, 2, 3])
    table = torch.randn(3, VOCAB)
    tracker.collect([chunk(s, 3)], right_aligned([chunk(s, 3)], [table]))
    torch.testing.assert_close(tracker.take_done()["x"].logprobs[:, 0], table[[0, 1], [2, 3]])


def test_single_token_prompt_gives_empty_prompt_logprobs():
    tracker = PromptLogprobs(VOCAB)
    s = state("x", [4], prompt_logprobs=1)
    tracker.add("x", s.sampling_params, [4])
    tracker.collect([chunk(s, 1)], torch.randn(1, 1, VOCAB))
    assert tracker.take_done()["x"].logprobs.shape == (0, 2)


# --- device-sampled rows --------------------------------------------------------------------------


def test_device_rows_take_the_model_tokens_and_sampled_logprobs():
    rows = [chunk(state("a", [1], logprobs=0), 1), chunk(state("b", [1]), 1)]
    out = ModelOutput(tokens=torch.tensor([7, 8, 9, 10]), logprobs=torch.tensor([-0.5, -1.5, float("nan"), -2.5]))
    sampled = from_device(out, torch.tensor([3, 0]), rows)
    assert sampled.tokens == [10, 7]
    assert sampled.logprobs.logprob_token_ids.tolist() == [[10], [7]]
    assert sampled.logprobs.logprobs.tolist() == [[-2.5], [-0.5]]
    assert sampled.logprobs.sampled_token_ranks.tolist() == [UNKNOWN_RANK] * 2


def test_device_rows_without_logprobs_requests_carry_none():
    rows = [chunk(state("a", [1]), 1)]
    assert from_device(ModelOutput(tokens=torch.tensor([4])), torch.tensor([0]), rows).logprobs is None


def test_device_rows_need_logprobs_when_asked():
    rows = [chunk(state("a", [1], logprobs=0), 1)]
    with pytest.raises(ModelOutputError, match="no logprobs"):
        from_device(ModelOutput(tokens=torch.tensor([4])), torch.tensor([0]), rows)


def test_device_rows_read_tt_metals_top_k_form():
    rows = [chunk(state("a", [1], logprobs=2), 1), chunk(state("b", [1], logprobs=0), 1)]
    top_ids = torch.tensor([[4, 9, 2, 7], [3, 5, 6, 1]])
    top_lp = torch.tensor([[-0.1, -1.0, -2.0, -3.0], [-0.2, -0.9, -1.9, -2.9]])
    out = parse((torch.tensor([9, 3]), (top_lp, top_ids)), sampled_on_device=True, owner="m")
    sampled = from_device(out, torch.tensor([0, 1]), rows)
    assert sampled.logprobs.logprob_token_ids.tolist() == [[9, 4, 9], [3, 3, 5]]
    torch.testing.assert_close(torch.as_tensor(sampled.logprobs.logprobs),
                               torch.tensor([[-1.0, -0.1, -1.0], [-0.2, -0.2, -0.9]]))
    assert sampled.logprobs.sampled_token_ranks.tolist() == [2, 1]


def test_top_k_form_must_contain_the_sampled_token():
    rows = [chunk(state("a", [1], logprobs=0), 1)]
    out = ModelOutput(tokens=torch.tensor([8]), logprobs=(torch.zeros(1, 2), torch.tensor([[1, 2]])))
    with pytest.raises(ModelOutputError, match="sampled token"):
        from_device(out, torch.tensor([0]), rows)


def test_top_k_form_is_host_output():
    assert is_host_output((torch.tensor([1]), (torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.int64))))
    assert not is_host_output((torch.tensor([1]), ("handle",)))


# --- host-sampled rows ----------------------------------------------------------------------------


def test_host_rows_are_in_row_order_with_their_logprobs():
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4),
                             model_config=SimpleNamespace(logits_processors=None, logprobs_mode="raw_logprobs"),
                             speculative_config=None)
    sampler = HostSamplingBatch(4, VOCAB, config, seed_stream=SeedStream.COUNTER)
    states = [state("a", [1, 2], slot=3, temperature=0.0, logprobs=1),
              state("b", [1], slot=1, temperature=0.0, logprobs=1)]
    for s in states:
        sampler.add_request(s.slot, s.req_id, s.sampling_params, s.prompt_token_ids, s.output_token_ids, None)
    logits = torch.zeros(2, VOCAB)
    logits[0, 5], logits[1, 9] = 4.0, 6.0
    sampled = from_host(sampler, logits, [chunk(s, len(s.prompt_token_ids)) for s in states], None)
    assert sampled.tokens == [5, 9]
    assert sampled.logprobs.logprob_token_ids[:, 0].tolist() == [5, 9]
    torch.testing.assert_close(torch.as_tensor(sampled.logprobs.logprobs[:, 0]), logits.log_softmax(-1)[[0, 1], [5, 9]])


def test_positions_are_the_last_input_token():
    decode = chunk(state("a", [1, 2, 3], computed=2), 3)
    prefill = chunk(state("b", [1, 2, 3, 4]), 4)
    assert positions([decode, prefill]) == [2, 3]


# --- device sampling inputs -----------------------------------------------------------------------


def test_device_kwargs_send_histories_only_with_penalties():
    plain = state("a", [1, 2])
    assert set(DeviceSampling.of([plain, None], VOCAB).to_contract_kwargs()) == {"sampling_params"}
    penalised = state("b", [4, 5, 6], presence_penalty=0.5)
    penalised.output_token_ids.extend([7, 7])
    kwargs = DeviceSampling.of([plain, None, penalised], VOCAB).to_contract_kwargs()
    assert kwargs["prompt_tokens"].tolist() == [[1, 2, -1], [-1, -1, -1], [4, 5, 6]]
    assert kwargs["output_tokens"].tolist() == [[-1, -1], [-1, -1], [7, 7]]
    assert kwargs["sampling_params"].presence_penalty == [0.0, 0.0, 0.5]


# --- trace ----------------------------------------------------------------------------------------


def test_sampling_trace_writes_one_line_per_decision(tmp_path):
    path = tmp_path / "trace.jsonl"
    trace = open_sampling_trace({TT_SAMPLING_TRACE.name: str(path)})
    assert isinstance(trace, JsonlSamplingTrace)
    trace.record(1, "decode", SamplingDecision(SamplingPath.HOST, "min_p"), ["b", "a"])
    trace.record(2, "prefill", SamplingDecision(SamplingPath.DEVICE, "device"), ["c"])
    trace.close()
    trace.record(3, "decode", SamplingDecision(SamplingPath.DEVICE, "device"), ["c"])  # closed: ignored
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"step": 1, "phase": "decode", "path": "host", "reason": "min_p", "requests": ["a", "b"]},
        {"step": 2, "phase": "prefill", "path": "device", "reason": "device", "requests": ["c"]},
    ]


def test_sampling_trace_is_off_without_the_variable():
    assert isinstance(open_sampling_trace({}), NullSamplingTrace)
    assert isinstance(open_sampling_trace({TT_SAMPLING_TRACE.name: ""}), NullSamplingTrace)
