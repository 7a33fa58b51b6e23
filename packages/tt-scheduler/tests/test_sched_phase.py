"""``step_phase``: the runner's view of a scheduler output."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from vllm_tt_scheduler.phase import MixedStepError, Phase, step_phase


@dataclass
class _New:
    req_id: str


@dataclass
class _Cached:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)


@dataclass
class _Output:
    scheduled_new_reqs: list[_New] = field(default_factory=list)
    scheduled_cached_reqs: _Cached = field(default_factory=_Cached)
    total_num_scheduled_tokens: int = 1


@pytest.mark.parametrize(
    ("output", "mid_prefill", "expected"),
    [
        (_Output(total_num_scheduled_tokens=0), set(), Phase.EMPTY),
        (_Output([_New("a"), _New("b")]), set(), Phase.PREFILL),
        (_Output(scheduled_cached_reqs=_Cached(["a"], {"a"})), set(), Phase.PREFILL),  # resumed
        (_Output(scheduled_cached_reqs=_Cached(["a"])), {"a"}, Phase.PREFILL),  # next chunk
        (_Output([_New("n")], _Cached(["a"])), {"a"}, Phase.PREFILL),
        (_Output(scheduled_cached_reqs=_Cached(["a", "b"])), {"c"}, Phase.DECODE),
    ],
)
def test_step_phase(output: _Output, mid_prefill: set[str], expected: Phase) -> None:
    assert step_phase(output, mid_prefill) is expected


@pytest.mark.parametrize(
    "output",
    [
        _Output([_New("n")], _Cached(["a"])),
        _Output(scheduled_cached_reqs=_Cached(["a", "r"], {"r"})),
    ],
)
def test_mixed_step_raises_naming_rows(output: _Output) -> None:
    with pytest.raises(MixedStepError) as err:
        step_phase(output, set())
    assert err.value.decode_req_ids == ("a",)
    assert "decode rows ['a']" in str(err.value)


def test_phase_module_and_defaults_import_without_vllm() -> None:
    code = (
        "import sys, vllm_tt_scheduler as m; m.Phase; m.DEFAULT_PREFILL_BURST; m.step_phase;"
        "m.USER_OPTIONS; m.record_prefill_trace_lens; import vllm_tt_scheduler.lanes.shape;"
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
