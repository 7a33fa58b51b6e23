"""Environment variables of the scheduler: one table, each with a parser and a note.

Read lazily (at scheduler construction), so tests can set them per case.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One documented environment variable."""

    name: str
    parse: Callable[[str], object]
    doc: str


def _path_or_none(value: str) -> str | None:
    return value or None


ENV_VARS: dict[str, EnvVar] = {
    var.name: var
    for var in (
        EnvVar(
            "TT_STEP_TRACE",
            _path_or_none,
            "Path of a JSON-lines step trace (one line per engine step: phase, "
            "scheduled tokens per request, queue sizes, preempted, finished, KV "
            "blocks in use). Unset or empty: off, at no cost.",
        ),
    )
}


def read(name: str) -> object:
    """Parsed value of ``name``, or None when it is unset."""
    var = ENV_VARS[name]
    raw = os.environ.get(name)
    return None if raw is None else var.parse(raw)


def step_trace_path() -> str | None:
    """Where to write the step trace, if anywhere."""
    value = read("TT_STEP_TRACE")
    return value if isinstance(value, str) else None
