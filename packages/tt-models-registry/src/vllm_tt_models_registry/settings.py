"""Where a value the user gave came from, so an error names what the user actually typed.

The same backend name or folder can arrive as a command-line argument or as an environment
variable; an error blaming the variable when the user typed the argument sends them to the
wrong place.
"""

from __future__ import annotations

from dataclasses import dataclass

ARGUMENT = "argument"
ENVIRONMENT = "environment variable"


@dataclass(frozen=True)
class Setting:
    """One input: an ``argument --backend`` or an ``environment variable TT_MESH_BACKEND``."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    def given(self, value: object) -> str:
        """The input and its bad value, for the start of an error message."""
        if self.kind == ARGUMENT:
            return f"{self} {value!r}"
        return f"{self}={value!r}"

    def spelled(self, value: object) -> str:
        """How the user writes ``value`` for this input (``--backend host``, ``X=host``)."""
        if self.kind == ARGUMENT:
            return f"{self.name} {value}" if self.name.startswith("-") else str(value)
        return f"{self.name}={value}"


def argument(name: str) -> Setting:
    return Setting(ARGUMENT, name)


def environment(name: str) -> Setting:
    return Setting(ENVIRONMENT, name)
