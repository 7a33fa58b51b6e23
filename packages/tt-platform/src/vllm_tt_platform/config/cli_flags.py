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

RECORDED = ("async_scheduling", "enable_prefix_caching", "disable_log_stats", "max_num_batched_tokens")
"""Destinations of the vLLM options whose explicit use turns a downgrade (or a pooling model's
raised step budget) into an error, and ``--disable-log-stats``, which turns the TT metrics off."""

_given: set[str] = set()
"""Destinations set on this process's command line: ``--x``, ``--no-x`` or a ``--config`` file
entry (vLLM turns those into the same arguments before parsing)."""

_values: dict[str, Any] = {}
"""The value each recorded destination was given."""

_parser_seen = False
"""Whether this process parsed vLLM's command line (the ``vllm serve`` front end does)."""


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
        _values[self.dest] = getattr(namespace, self.dest, None)


def record_explicit_use(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s actions for the :data:`RECORDED` options note each use.

    argparse has no hook for this; the actions are already built by vLLM (and are a different
    class on each vLLM release), so each one gets a subclass of its own class.
    """
    global _parser_seen
    _parser_seen = True
    for action in parser._actions:
        if action.dest in RECORDED:
            action.__class__ = type(f"Recorded{type(action).__name__}", (_RecordsUse, type(action)), {})


def given(dest: str) -> bool:
    """Whether the user set ``dest`` on the command line of this process."""
    return dest in _given


def given_value(dest: str) -> Any:
    """The value the user gave ``dest`` on the command line; None if not given."""
    return _values.get(dest)


def parsed_command_line() -> bool:
    """Whether this process parsed vLLM's command line (``vllm serve``'s front end)."""
    return _parser_seen


def forget() -> None:
    """Forget the command line recorded so far, for a process that parses many in turn (the flag
    fuzz, ``vllm_tt_testing.flag_fuzz``); ``vllm serve`` parses one."""
    global _parser_seen
    _given.clear()
    _values.clear()
    _parser_seen = False
