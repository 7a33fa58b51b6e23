"""Makes bundle modules importable without touching ``sys.path``.

Appending a bundle folder to ``sys.path`` (the reference backend's way) makes every file in
it importable by every name, for the rest of the process. Instead one finder, at the end of
``sys.meta_path``, answers only for the top-level module names bundles were checked to own,
each from its own folder. vLLM can then import ``"my_adapter:MyModel"`` lazily in any process
where the plugin ran (its model-inspection subprocess loads plugins too).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType


class BundleModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level modules claimed by bundles, and nothing else."""

    def __init__(self) -> None:
        self._folders: dict[str, Path] = {}

    def owner(self, name: str) -> Path | None:
        """The bundle folder that claimed module ``name``, if any."""
        return self._folders.get(name)

    def claims(self) -> dict[str, Path]:
        """Module name -> bundle folder, for every claimed module."""
        return dict(self._folders)

    def claim(self, name: str, folder: Path) -> None:
        """Serve top-level module ``name`` from ``folder``; the caller checked it is free."""
        self._folders[name] = folder

    def release(self, folder: Path) -> None:
        """Forget every module claimed by ``folder`` (for tests and re-checks)."""
        self._folders = {n: f for n, f in self._folders.items() if f != folder}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        folder = self._folders.get(fullname)
        if folder is None or path is not None:
            return None  # submodules are found through their package's __path__
        return importlib.machinery.PathFinder.find_spec(fullname, [str(folder)])


_FINDER: BundleModuleFinder | None = None


def bundle_finder() -> BundleModuleFinder:
    """The process's finder, installed at the end of ``sys.meta_path`` on first use."""
    global _FINDER
    if _FINDER is None:
        _FINDER = BundleModuleFinder()
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    return _FINDER


def installed_origin(name: str, folder: Path) -> str | None:
    """Where an importable top-level module ``name`` comes from, if not from ``folder``.

    Used to refuse bundle modules that would shadow (or be shadowed by) an installed
    package, a standard-library module or an already imported module.
    """
    if name in sys.builtin_module_names:
        return "built-in module"
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = _origin(getattr(loaded, "__spec__", None)) or repr(loaded)
        return None if _inside(origin, folder) else origin
    for finder in sys.meta_path:
        if isinstance(finder, BundleModuleFinder):
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, None)
        except Exception:  # a third-party finder failing is not our bundle's problem
            continue
        if spec is not None:
            origin = _origin(spec) or f"module {name}"
            return None if _inside(origin, folder) else origin
    return None


def _origin(spec: ModuleSpec | None) -> str | None:
    if spec is None:
        return None
    if spec.origin not in (None, "namespace"):
        return str(spec.origin)
    locations = list(spec.submodule_search_locations or [])
    return str(locations[0]) if locations else None


def _inside(origin: str, folder: Path) -> bool:
    try:
        return Path(origin).resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError):
        return False
