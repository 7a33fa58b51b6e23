"""Which vLLM options the user gave on the command line, as opposed to vLLM's defaults.

The config the platform receives cannot tell an explicit ``--enable-prefix-caching`` from vLLM
turning its ``None`` default into ``True``; only the CLI parser can. So an explicit request the
model cannot serve is an error, while a default is switched off with one info line. The offline
``vllm.LLM(...)`` path runs no parser: there nothing counts as explicit.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

RECORDED = ("async_scheduling", "enable_prefix_caching")
"""Destinations of the vLLM options whose explicit use turns a downgrade into an error."""

_given: set[str] = set()
"""Destinations set on this process's command line: ``--x``, ``--no-x`` or a ``--config`` file
entry (vLLM turns those into the same arguments before parsing)."""


class _RecordsUse(argparse.Action):
    """Put in front of a parser action's own class: does what that class does, then notes the use."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        _given.add(self.dest)


def record_explicit_use(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s actions for the :data:`RECORDED` options note each use.

    argparse has no hook for this; the actions are already built by vLLM (and are a different
    class on each vLLM release), so each one gets a subclass of its own class.
    """
    for action in parser._actions:
        if action.dest in RECORDED:
            action.__class__ = type(f"Recorded{type(action).__name__}", (_RecordsUse, type(action)), {})


def given(dest: str) -> bool:
    """Whether the user set ``dest`` on the command line of this process."""
    return dest in _given
