"""Phase purity read from the scheduler's step trace (``TT_STEP_TRACE``), not from its labels.

The runner's sampling trace and ``MixedStepError`` use the scheduler's own classification of a
step; this check rebuilds each row's phase from the tokens the trace says were scheduled, so a
classification bug cannot hide a mixed step. A row is a decode when its request was scheduled in
an earlier step and gets exactly one token; a request that decoded is *decoding* until it
finishes or is preempted. A step is mixed when the step labelled decode holds a row that is not
a decode, a step labelled prefill holds a decoding request, or a step labelled empty holds any row.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StepTraceCheck:
    """Steps of a ``TT_STEP_TRACE`` file by phase, and the first steps found mixed."""

    steps: int = 0
    mixed_steps: int = 0
    by_phase: Counter[str] = field(default_factory=Counter)
    mixed: list[str] = field(default_factory=list)
    """The first offending steps: number, label and the rows that break it."""

    @property
    def pure(self) -> bool:
        return self.steps > 0 and not self.mixed_steps and set(self.by_phase) <= {"prefill", "decode", "empty"}


def check_step_trace(path: Path, keep: int = 20) -> StepTraceCheck:
    """Read ``path`` (one JSON object per step, docs/scheduling.md#step-trace) and check every step."""
    out = StepTraceCheck()
    seen: set[str] = set()
    decoding: set[str] = set()
    with path.open() as lines:
        for line in lines:
            step = json.loads(line)
            phase, scheduled = step["phase"], step["scheduled"]
            out.steps += 1
            out.by_phase[phase] += 1
            # Both lists name requests that left before this step was scheduled.
            decoding -= set(step["finished"]) | set(step["preempted"])
            seen -= set(step["finished"])
            if phase == "decode":
                bad = {r: n for r, n in scheduled.items() if r not in seen or n != 1}
                decoding.update(scheduled)
            elif phase == "empty":
                bad = dict(scheduled)
            else:
                bad = {r: n for r, n in scheduled.items() if r in decoding}
            if bad:
                out.mixed_steps += 1
                if len(out.mixed) < keep:
                    out.mixed.append(f"step {step['step']} ({phase}): {bad}")
            seen.update(scheduled)
    return out
