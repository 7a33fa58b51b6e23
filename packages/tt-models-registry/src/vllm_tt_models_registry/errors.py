"""The errors the registry raises: each names what is wrong, where, and how to fix it."""

from __future__ import annotations

from pathlib import Path


class RegistryError(ValueError):
    """The TT model registry cannot be built or cannot resolve a model."""


class BundleError(RegistryError):
    """A model bundle in ``EXTRA_MODELS_DIR`` is broken.

    Startup fails on it (the reference backend only warned, and a wrong class then failed
    much later inside vLLM). ``folder`` and ``field`` are kept for callers and tests.
    """

    def __init__(self, folder: Path | str, field: str, problem: str, fix: str) -> None:
        self.folder = Path(folder)
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"model bundle {self.folder}: {field}: {problem}. Fix: {fix}")


class ContractError(TypeError):
    """A model class does not satisfy the TT model contract (``contract.TTModel``).

    ``owner`` names where the class was registered from (a bundle, a table entry).
    """

    def __init__(self, owner: str, problem: str, fix: str) -> None:
        self.owner = owner
        self.problem = problem
        self.fix = fix
        super().__init__(f"{owner}: {problem}. Fix: {fix}")
