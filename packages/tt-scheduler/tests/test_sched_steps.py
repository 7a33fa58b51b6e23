"""Step tables: vLLM's real scheduler under TTScheduler, one row per engine step.

Row: (repeat, phase, waiting, running, scheduled tokens, finished, preempted), where
waiting/running are counted right after ``schedule()``, ``finished`` are the requests
whose finish the step's update reported, and runs of identical rows are collapsed
into one with a repeat count. A fake runner executes every step and raises on a mixed
step or on rows inconsistent with what it ran before (``vllm_tt_testing.scheduler_sim``).
"""

from __future__ import annotations

import json
from concurrent.futures import Future

import pytest
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm_tt_scheduler import Phase, TTAsyncScheduler, TTScheduler
from vllm_tt_testing.scheduler_sim import (
    Engine,
    SimConfig,
    build_scheduler,
    greedy_tokens,
    make_request,
    step_table,
)


def engine(**config: object) -> Engine:
    return Engine(build_scheduler(TTScheduler, SimConfig(**config)))  # type: ignore[arg-type]


def assert_clean_end(sim: Engine) -> None:
    """Every request finished exactly once and the runner was told about each."""
    assert all(log.finishes == 1 for log in sim.logs.values()), sim.logs
    assert not sim.unsent_finished
    assert not sim.runner.rows


def test_plain_decode() -> None:
    sim = engine()
    sim.add(make_request("a", 8, 3))
    sim.add(make_request("b", 8, 2))
    assert step_table(sim.run(50)) == [
        (1, "P", 0, 2, {"a": 8, "b": 8}, (), ()),
        (1, "D", 0, 2, {"a": 1, "b": 1}, ("b",), ()),
        (1, "D", 0, 1, {"a": 1}, ("a",), ()),
        (1, "E", 0, 0, {}, (), ()),  # hands the last finished id to the runner
    ]
    assert sim.logs["a"].tokens == greedy_tokens("a", 8, 3)
    assert_clean_end(sim)


def test_arrival_during_decode_is_held_then_prefilled() -> None:
    # prefill_hold=0.5: the newcomer waits until its wait (request-steps) reaches half
    # the 4 decodes a prefill step would stall.
    sim = engine(max_num_seqs=8)
    for req_id in "abcd":
        sim.add(make_request(req_id, 8, 6))
    records = sim.run(2)
    sim.add(make_request("e", 8, 2))
    records += sim.run(50)
    assert step_table(records) == [
        (1, "P", 0, 4, {"a": 8, "b": 8, "c": 8, "d": 8}, (), ()),
        (1, "D", 0, 4, {"a": 1, "b": 1, "c": 1, "d": 1}, (), ()),
        (1, "D", 1, 4, {"a": 1, "b": 1, "c": 1, "d": 1}, (), ()),
        (1, "P", 0, 5, {"e": 8}, (), ()),
        (1, "D", 0, 5, {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, ("e",), ()),
        (1, "D", 0, 4, {"a": 1, "b": 1, "c": 1, "d": 1}, (), ()),
        (1, "D", 0, 4, {"a": 1, "b": 1, "c": 1, "d": 1}, ("a", "b", "c", "d"), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert_clean_end(sim)


def test_arrival_without_hold_is_prefilled_next_step() -> None:
    sim = engine(max_num_seqs=8, tt={"prefill_hold": 0})
    for req_id in "abcd":
        sim.add(make_request(req_id, 8, 4))
    records = sim.run(2)
    sim.add(make_request("e", 8, 2))
    records += sim.run(1)
    assert [row[1:4] for row in step_table(records)] == [("P", 0, 4), ("D", 0, 4), ("P", 0, 5)]


def test_long_prompt_is_chunked_with_decodes_interleaved() -> None:
    # Budget 64 tokens per step; b's 200-token prompt takes four prefill-only chunks,
    # and with prefill_burst=1 a decode step follows each of them.
    sim = engine(tt={"prefill_burst": 1})
    sim.add(make_request("a", 8, 12))
    records = sim.run(1)
    sim.add(make_request("b", 200, 2))
    records += sim.run(50)
    assert step_table(records) == [
        (1, "P", 0, 1, {"a": 8}, (), ()),
        (1, "D", 1, 1, {"a": 1}, (), ()),  # b held: its 4 chunks would stall a 4 times
        (1, "P", 0, 2, {"b": 64}, (), ()),
        (1, "D", 0, 2, {"a": 1}, (), ()),
        (1, "P", 0, 2, {"b": 64}, (), ()),
        (1, "D", 0, 2, {"a": 1}, (), ()),
        (1, "P", 0, 2, {"b": 64}, (), ()),
        (1, "D", 0, 2, {"a": 1}, (), ()),
        (1, "P", 0, 2, {"b": 8}, (), ()),  # the last chunk samples b's first token
        (1, "D", 0, 2, {"a": 1, "b": 1}, ("b",), ()),
        (5, "D", 0, 1, {"a": 1}, (), ()),
        (1, "D", 0, 1, {"a": 1}, ("a",), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert sim.logs["b"].tokens == greedy_tokens("b", 200, 2)
    assert_clean_end(sim)


def test_chunks_follow_the_model_prefill_trace_lengths() -> None:
    # The model's largest prefill trace (48) caps each request's chunk below the
    # step budget (64), also when the request is the only one vLLM sees.
    sim = engine(long_prefill_token_threshold=48, tt={"_prefill_trace_lens": [16, 48]})
    sim.add(make_request("a", 100, 2))
    assert [record.scheduled for record in sim.run(3)] == [{"a": 48}, {"a": 48}, {"a": 4}]


def test_prefill_burst_bounds_the_decode_stall() -> None:
    # Six 40-token prompts arrive while a and b decode; one fits each 64-token step.
    # prefill_burst=2: after two prefill steps in a row, the decodes get a step.
    sim = engine(max_num_seqs=8, tt={"prefill_burst": 2})
    sim.add(make_request("a", 8, 14))
    sim.add(make_request("b", 8, 14))
    records = sim.run(1)
    for req_id in "cdefgh":
        sim.add(make_request(req_id, 40, 2))
    records += sim.run(60)
    assert step_table(records) == [
        (1, "P", 0, 2, {"a": 8, "b": 8}, (), ()),
        (1, "P", 5, 3, {"c": 40}, (), ()),
        (1, "P", 4, 4, {"d": 40}, (), ()),
        (1, "D", 4, 4, {"a": 1, "b": 1, "c": 1, "d": 1}, ("c", "d"), ()),
        (1, "P", 3, 3, {"e": 40}, (), ()),
        (1, "P", 2, 4, {"f": 40}, (), ()),
        (1, "D", 2, 4, {"a": 1, "b": 1, "e": 1, "f": 1}, ("e", "f"), ()),
        (1, "P", 1, 3, {"g": 40}, (), ()),
        (1, "D", 1, 3, {"a": 1, "b": 1, "g": 1}, ("g",), ()),  # h alone: held a step
        (1, "P", 0, 3, {"h": 40}, (), ()),
        (1, "D", 0, 3, {"a": 1, "b": 1, "h": 1}, ("h",), ()),
        (8, "D", 0, 2, {"a": 1, "b": 1}, (), ()),
        (1, "D", 0, 2, {"a": 1, "b": 1}, ("a", "b"), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert_clean_end(sim)


def test_kv_pressure_preempts_and_resumes_exactly_where_it_was() -> None:
    # 5 usable blocks of 16 tokens; a and b each grow to 40 tokens (3 blocks). When b
    # needs its third block, vLLM preempts it; it resumes after a finishes, replaying
    # prompt + generated tokens (16 + 17) as a prefill, and generates what it would have.
    sim = engine(max_model_len=64, num_blocks=6)
    sim.add(make_request("a", 16, 24))
    sim.add(make_request("b", 16, 24))
    assert step_table(sim.run(200)) == [
        (1, "P", 0, 2, {"a": 16, "b": 16}, (), ()),
        (16, "D", 0, 2, {"a": 1, "b": 1}, (), ()),
        (1, "D", 1, 1, {"a": 1}, (), ("b",)),
        (5, "D", 1, 1, {"a": 1}, (), ()),
        (1, "D", 1, 1, {"a": 1}, ("a",), ()),
        (1, "P", 0, 1, {"b": 33}, (), ()),
        (5, "D", 0, 1, {"b": 1}, (), ()),
        (1, "D", 0, 1, {"b": 1}, ("b",), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert sim.logs["a"].tokens == greedy_tokens("a", 16, 24)
    assert sim.logs["b"].tokens == greedy_tokens("b", 16, 24)
    assert_clean_end(sim)


def test_zero_token_prefill_is_redone_as_decode_carrying_finished_ids(tmp_path, monkeypatch) -> None:
    # With prefix caching the KV need of d cannot be predicted, so its prefill pass is
    # tried and admits nothing. a finished in the previous step: that pass drained a's
    # id, and the decode step that replaces it must still hand it to the runner.
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TT_STEP_TRACE", str(trace))
    sim = engine(max_model_len=64, num_blocks=7, enable_prefix_caching=True)
    for req_id in "abc":
        sim.add(make_request(req_id, 16, 3 if req_id == "a" else 30))
    records = sim.run(2)
    sim.add(make_request("d", 48, 2))
    records += sim.run(100)
    assert step_table(records)[:4] == [
        (1, "P", 0, 3, {"a": 16, "b": 16, "c": 16}, (), ()),
        (1, "D", 0, 3, {"a": 1, "b": 1, "c": 1}, (), ()),
        (1, "D", 1, 3, {"a": 1, "b": 1, "c": 1}, ("a",), ()),
        (26, "D", 1, 2, {"b": 1, "c": 1}, (), ()),
    ]
    retried = records[3]
    assert retried.phase is Phase.DECODE and retried.sent_finished == ("a",)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[3]["retried"] is True and lines[3]["finished"] == ["a"]
    # After a failed admission, passes are not retried every step (host cost).
    assert sum(line["retried"] for line in lines) <= 3
    assert_clean_end(sim)


def test_abort_during_prefill_chunk() -> None:
    sim = engine(tt={"prefill_burst": 1})
    sim.add(make_request("a", 8, 10))
    sim.add(make_request("b", 200, 4))
    records = sim.run(3)
    sim.abort(["b"])
    records += sim.run(50)
    assert step_table(records) == [
        (1, "P", 0, 2, {"a": 8, "b": 56}, (), ()),  # b starts in the leftover budget
        (1, "P", 0, 2, {"b": 64}, (), ()),
        (1, "D", 0, 2, {"a": 1}, (), ()),
        (7, "D", 0, 1, {"a": 1}, (), ()),
        (1, "D", 0, 1, {"a": 1}, ("a",), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert records[3].sent_finished == ("b",)
    assert sim.logs["b"].finish_reason == "abort"
    assert_clean_end(sim)


class _Grammar:
    """Accepts everything; stands in for a compiled grammar."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False


def structured_request(req_id: str, grammar: Future) -> object:
    params = SamplingParams(
        max_tokens=3, ignore_eos=True, structured_outputs=StructuredOutputsParams(json={"type": "object"})
    )
    request = make_request(req_id, 8, 3, params)
    request.structured_output_request.grammar = grammar  # what the engine does at arrival
    return request


def test_request_waiting_for_its_grammar_blocks_nothing() -> None:
    sim = engine()
    grammar: Future = Future()
    sim.add(structured_request("g", grammar))
    sim.add(make_request("a", 8, 6))
    records = sim.run(2)
    sim.add(make_request("h", 8, 2))  # arrives behind g
    records += sim.run(2)
    grammar.set_result(_Grammar())
    records += sim.run(50)
    assert step_table(records) == [
        (1, "P", 1, 1, {"a": 8}, (), ()),
        (1, "D", 1, 1, {"a": 1}, (), ()),
        (1, "P", 1, 2, {"h": 8}, (), ()),
        (1, "D", 1, 2, {"a": 1, "h": 1}, ("h",), ()),
        (1, "P", 0, 2, {"g": 8}, (), ()),  # grammar ready
        (1, "D", 0, 2, {"a": 1, "g": 1}, (), ()),
        (1, "D", 0, 2, {"a": 1, "g": 1}, ("g",), ()),
        (1, "D", 0, 1, {"a": 1}, ("a",), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert_clean_end(sim)


def test_failed_grammar_finishes_as_error_while_decodes_run() -> None:
    sim = engine()
    grammar: Future = Future()
    sim.add(structured_request("g", grammar))
    sim.add(make_request("a", 8, 6))
    records = sim.run(2)
    grammar.set_exception(ValueError("bad schema"))
    records += sim.run(50)
    assert step_table(records) == [
        (1, "P", 1, 1, {"a": 8}, (), ()),
        (1, "D", 1, 1, {"a": 1}, (), ()),
        (1, "D", 1, 1, {"a": 1}, ("g",), ()),
        (2, "D", 0, 1, {"a": 1}, (), ()),
        (1, "D", 0, 1, {"a": 1}, ("a",), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert sim.logs["g"].finish_reason == "error"
    assert_clean_end(sim)


@pytest.mark.parametrize("num_blocks", [None, 6], ids=["ample-kv", "kv-pressure"])
def test_async_scheduling_keeps_phases_and_outputs(num_blocks: int | None) -> None:
    # Under async scheduling the next step is scheduled before the previous one's
    # tokens are back; phases stay pure and outputs are those of the sync run.
    config = SimConfig(max_model_len=64, num_blocks=num_blocks, async_scheduling=True)
    sim = Engine(build_scheduler(TTAsyncScheduler, config), async_depth=2)
    lengths = {"a": (16, 24), "b": (16, 24), "c": (40, 5)}
    for req_id, (prompt, out) in lengths.items():
        sim.add(make_request(req_id, prompt, out))
    records = sim.run(300)
    phases = {record.phase for record in records}
    assert phases <= {Phase.PREFILL, Phase.DECODE, Phase.EMPTY}
    if num_blocks:
        assert any(record.preempted for record in records)
    for req_id, (prompt, out) in lengths.items():
        assert sim.logs[req_id].tokens == greedy_tokens(req_id, prompt, out)
    assert_clean_end(sim)
