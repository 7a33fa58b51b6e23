"""The soak's independent phase check: rows of a ``TT_STEP_TRACE`` file, not the scheduler's labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_tt_testing.step_trace import check_step_trace


def _trace(tmp_path: Path, *steps: tuple[str, dict[str, int], list[str], list[str]]) -> Path:
    path = tmp_path / "steps.jsonl"
    lines: list[dict[str, Any]] = [
        {"step": i, "phase": phase, "scheduled": scheduled, "finished": finished, "preempted": preempted,
         "num_waiting": 0, "num_running": len(scheduled), "kv_blocks_used": 1, "kv_blocks_total": 8, "retried": False}
        for i, (phase, scheduled, finished, preempted) in enumerate(steps)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_prefill_chunks_decodes_preemption_and_finish_are_pure(tmp_path: Path) -> None:
    check = check_step_trace(_trace(
        tmp_path,
        ("prefill", {"a": 64, "b": 10}, [], []),
        ("prefill", {"a": 1}, [], []),  # a's last chunk is one token: still a prefill row
        ("decode", {"a": 1, "b": 1}, [], []),
        ("prefill", {"c": 5}, [], ["b"]),  # b is preempted for c
        ("prefill", {"b": 12}, [], []),  # and re-prefilled
        ("decode", {"a": 1, "b": 1, "c": 1}, [], []),
        ("decode", {"b": 1, "c": 1}, ["a"], []),
        ("empty", {}, [], []),
        ("prefill", {"a2": 3}, ["b", "c"], []),
    ))
    assert check.pure and check.steps == 9 and check.by_phase == {"prefill": 5, "decode": 3, "empty": 1}


def test_a_decoding_request_in_a_prefill_step_is_mixed(tmp_path: Path) -> None:
    check = check_step_trace(_trace(
        tmp_path,
        ("prefill", {"a": 8}, [], []),
        ("decode", {"a": 1}, [], []),
        ("prefill", {"a": 1, "b": 8}, [], []),
    ))
    assert not check.pure and check.mixed == ["step 2 (prefill): {'a': 1}"]


def test_a_new_or_multi_token_row_in_a_decode_step_is_mixed(tmp_path: Path) -> None:
    check = check_step_trace(_trace(
        tmp_path,
        ("prefill", {"a": 8}, [], []),
        ("decode", {"a": 1, "b": 4}, [], []),
        ("decode", {"a": 3}, [], []),
    ))
    assert check.mixed_steps == 2 and check.mixed == ["step 1 (decode): {'b': 4}", "step 2 (decode): {'a': 3}"]


def test_an_empty_step_with_rows_or_an_unknown_label_is_not_pure(tmp_path: Path) -> None:
    assert check_step_trace(_trace(tmp_path, ("empty", {"a": 8}, [], []))).mixed == ["step 0 (empty): {'a': 8}"]
    assert not check_step_trace(_trace(tmp_path, ("mixed", {"a": 8}, [], []))).pure
