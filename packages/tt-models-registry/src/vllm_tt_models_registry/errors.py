"""The errors the registry raises: each names what is wrong, where, and how to fix it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class RegistryError(ValueError):
    """The TT model registry cannot be built or cannot resolve a model."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: the field (or file, module) it is in, and its fix."""

    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}. Fix: {self.fix}"


class BundleError(RegistryError):
    """A model bundle in ``EXTRA_MODELS_DIR`` is broken.

    Startup fails on it (the reference backend only warned, and a wrong class then failed
    much later inside vLLM). ``folder`` and ``field`` (of the first problem) are kept for
    callers and tests; ``problems`` holds every problem found, so one run shows them all.
    """

    def __init__(self, folder: Path | str, field: str, problem: str, fix: str) -> None:
        self.folder = Path(folder)
        self.problems: tuple[Problem, ...] = (Problem(field, problem, fix),)
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"model bundle {self.folder}: {self.problems[0]}")

    @classmethod
    def of(cls, folder: Path | str, problems: Sequence[Problem]) -> BundleError:
        """One error reporting every problem (a bullet list when there are several)."""
        first = problems[0]
        error = cls(folder, first.field, first.problem, first.fix)
        if len(problems) > 1:
            error.problems = tuple(problems)
            lines = "".join(f"\n  - {p}" for p in problems)
            error.args = (f"model bundle {error.folder}: {len(problems)} problems:{lines}",)
        return error


class ContractError(TypeError):
    """A model class does not satisfy the TT model contract (``contract.TTModel``).

    ``owner`` names where the class was registered from (a bundle, a table entry).
    """

    def __init__(self, owner: str, problem: str, fix: str) -> None:
        self.owner = owner
        self.problem = problem
        self.fix = fix
        super().__init__(f"{owner}: {problem}. Fix: {fix}")
