"""The classes a vLLM surface entry (a ``vllm serve`` option, a request field) can have on TT,
and the table lookup both surface manifests (``serve_surface``, ``request_surface``) share.

A name the TT backend never looked at may be silently ignored while the user believes it is
on; each manifest gives every name of vLLM's surface exactly one :class:`Support` class, with
its proof or reason. Exact entries win over prefix rules; a name matching two prefix rules is an
error.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class Support(enum.Enum):
    WORKS = "works"
    """Served on TT; ``proof`` is the pytest node id (``path::test``) that shows it."""
    REFUSED = "refused"
    """Refused with a typed error (at startup, or per request with HTTP 400); ``proof`` is the
    check (``module:function``)."""
    FRONT_END = "front end"
    """Platform-independent API-server, tokenizer-side or logging behaviour: vLLM's own front
    end acts on it exactly as on any platform; not the TT backend's concern."""
    NOT_APPLICABLE = "n/a"
    """Acts on a GPU, CUDA kernel, NCCL or Ray mechanism the TT backend does not use."""
    GAP = "ignored (gap)"
    """Accepted but ignored, overridden or unverified on TT: a user may believe it is on.
    These are issue #36's to-do list."""


@dataclass(frozen=True)
class Entry:
    """One class for a set of names: named exactly, or by a common prefix."""

    support: Support
    proof: str
    """The test node id (WORKS), the check ``module:function`` (REFUSED), or why (the others)."""
    dests: tuple[str, ...] = ()
    prefix: str = ""


@dataclass(frozen=True)
class Resolution:
    dest: str
    entry: Entry | None
    """None: unclassified (no entry) or ambiguous (``clashes`` lists the rules)."""
    clashes: tuple[Entry, ...] = ()


def resolve(dest: str, surface: tuple[Entry, ...]) -> Resolution:
    """The one entry classifying ``dest``: its exact entry, else the one prefix rule it matches."""
    exact = [e for e in surface if dest in e.dests]
    if exact:
        return Resolution(dest, exact[0] if len(exact) == 1 else None, tuple(exact) if len(exact) > 1 else ())
    by_prefix = [e for e in surface if e.prefix and dest.startswith(e.prefix)]
    if len(by_prefix) == 1:
        return Resolution(dest, by_prefix[0])
    return Resolution(dest, None, tuple(by_prefix))


def unresolved(names: Iterable[str], surface: tuple[Entry, ...]) -> list[str]:
    """One line per name the table does not resolve to exactly one class."""
    out = []
    for name in sorted(set(names)):
        res = resolve(name, surface)
        if res.entry is None:
            out.append(f"{name}: " + (f"matched by {len(res.clashes)} entries" if res.clashes else "unclassified"))
    return out


CLASS_DOCS = {
    Support.WORKS: "served on TT, with the test that shows it.",
    Support.REFUSED: "refused with an error naming it, by the check named.",
    Support.FRONT_END: "acted on by vLLM's own front end, as on any platform.",
    Support.NOT_APPLICABLE: "a GPU, CUDA kernel, NCCL or Ray mechanism the TT backend does not use.",
    Support.GAP: "accepted but ignored, overridden or not yet shown to work on TT (the to-do list).",
}


def table_rows(surface: tuple[Entry, ...], name: Callable[[str], str]) -> list[str]:
    """The markdown rows of ``surface``, grouped by class; ``name`` renders one name."""
    lines = ["| class | names | proof or reason |", "|---|---|---|"]
    for support in Support:
        for entry in (e for e in surface if e.support is support):
            names = ", ".join(f"`{name(d)}`" for d in entry.dests) if entry.dests else f"`{name(entry.prefix)}*`"
            why = f"`{entry.proof}`" if support in (Support.WORKS, Support.REFUSED) else entry.proof
            lines.append(f"| {support.value} | {names} | {why} |")
    return lines


def class_legend() -> str:
    return " ".join(f"**{s.value}**: {CLASS_DOCS[s]}" for s in Support)
