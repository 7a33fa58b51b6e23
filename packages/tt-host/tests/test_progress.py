"""The tiny model's training says how far it is and how long is left (a first demo start trains
for minutes on a 2-core machine)."""

from __future__ import annotations

import io

from vllm_tt_host.progress import REPORT_SECONDS, TrainingProgress, line


def test_a_line_has_step_percent_loss_elapsed_and_eta():
    assert line(150, 600, 75.0, 3.14159) == (
        "tiny model: training step 150/600 (25 %), loss 3.14, 1 min 15 s elapsed, ETA 3 min 45 s"
    )
    assert line(10, 600, 4.0, 5.0).endswith("4 s elapsed, ETA 3 min 56 s")


def test_lines_come_early_then_every_few_seconds_and_at_the_end():
    now = [0.0]
    out = io.StringIO()
    progress = TrainingProgress(100, out=out, clock=lambda: now[0])
    read: list[int] = []
    for step in range(1, 101):
        now[0] += REPORT_SECONDS / 4  # four steps per report interval
        progress.step(step, lambda step=step: read.append(step) or 2.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "tiny model: training 100 steps on the shipped corpus"
    steps = [int(text.split("step ")[1].split("/")[0]) for text in lines[1:]]
    assert steps[0] == 4 and steps[1:3] == [8, 10] and steps[-1] == 100  # every interval, the early ETA, the end
    assert all(b - a <= 4 for a, b in zip(steps, steps[1:], strict=False))
    assert read == steps  # the loss is read (a device sync in torch) only for a line
