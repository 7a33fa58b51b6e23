"""Model sources: other packages' tables of TT models, found through an entry-point group.

A mesh backend other than ttnn (the host reference backend) brings its own implementations of
some families. It declares them as ``[project.entry-points."vllm_tt.model_sources"]
<backend> = "pkg.module:TABLE"``, where ``TABLE`` maps TT (or HF) architecture names to lazy
``module:Class`` targets, or to ``{"target": "module:Class", "capabilities": {...}}`` when the
source also states each class's capabilities (all of them, as the class declares them), so that
a listing (``vllm-tt-models list``) needs no import of model code. The registry never imports
the providing package's code otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.errors import ContractError, RegistryError
from vllm_tt_models_registry.names import is_target, tt_arch_name
from vllm_tt_models_registry.settings import Setting, environment

MODEL_SOURCES_GROUP = "vllm_tt.model_sources"


@dataclass(frozen=True)
class ModelSource:
    """One backend's table of TT models: ``{TT arch: "module:Class"}``."""

    name: str
    targets: Mapping[str, str] = field(default_factory=dict)
    origin: str = ""
    """Where the table came from (an entry point), for error messages."""
    capabilities: Mapping[str, ModelCapabilities] = field(default_factory=dict)
    """What the source states each class declares (by TT arch; only the entries that say)."""

    @classmethod
    def from_table(cls, name: str, table: Any, *, origin: str) -> ModelSource:
        """Validate a source's table: architecture names to ``module:Class`` or to
        ``{"target": ..., "capabilities": ...}``."""
        if not isinstance(table, Mapping):
            raise RegistryError(
                f"model source {name!r} ({origin}) must be a dict of architecture -> "
                f"'module:Class', got {type(table).__name__}. Fix: the providing package "
                f"must export a dict"
            )
        targets: dict[str, str] = {}
        stated: dict[str, ModelCapabilities] = {}
        for arch, entry in table.items():
            where = f"model source {name!r} ({origin}): entry {arch!r}"
            target: Any = entry.get("target") if isinstance(entry, Mapping) else entry
            caps = entry.get("capabilities") if isinstance(entry, Mapping) else None
            if isinstance(entry, Mapping) and set(entry) - _ENTRY_KEYS:
                raise RegistryError(
                    f"{where}: unknown keys {sorted(set(entry) - _ENTRY_KEYS)}. Fix: an entry holds "
                    f"only {sorted(_ENTRY_KEYS)}"
                )
            if not isinstance(arch, str) or not is_target(target):
                raise RegistryError(
                    f"{where}: {target!r} is not a 'module:Class' string. Fix: correct the table "
                    f"in the providing package"
                )
            targets[tt_arch_name(arch)] = target
            if caps is not None:
                try:
                    stated[tt_arch_name(arch)] = ModelCapabilities.from_mapping(caps, owner=target)
                except ContractError as exc:
                    raise RegistryError(
                        f"{where}: {exc.problem}. Fix: correct the table in the providing package"
                    ) from exc
        return cls(name, targets, origin, stated)


_ENTRY_KEYS = frozenset({"target", "capabilities"})


def installed_source_names(eps: Iterable[metadata.EntryPoint] | None = None) -> tuple[str, ...]:
    """Names of the model sources installed packages declare (cheap: nothing is imported)."""
    found = _entry_points() if eps is None else eps
    return tuple(sorted({ep.name for ep in found}))


BACKEND_SETTING = environment("TT_MESH_BACKEND")
"""Where a backend name comes from unless the caller says otherwise."""


def load_source(
    name: str, eps: Iterable[metadata.EntryPoint] | None = None, *, setting: Setting = BACKEND_SETTING
) -> ModelSource:
    """Import the table of the model source called ``name`` (for the mesh backend ``name``).

    ``setting`` names the input the backend came from, for the error when there is no such source.
    """
    found = list(_entry_points() if eps is None else eps)
    matches = [ep for ep in found if ep.name == name]
    if not matches:
        choices = ", ".join(setting.spelled(n) for n in ("ttnn", *installed_source_names(found)))
        raise RegistryError(
            f"{setting.given(name)}: that mesh backend needs a model source named {name!r} in "
            f"the entry-point group {MODEL_SOURCES_GROUP}, and no installed package declares "
            f"one. Fix: use one of {choices}, or install the package providing {name!r} (vllm-tt-host provides 'host')"
        )
    if len({ep.value for ep in matches}) > 1:
        raise RegistryError(
            f"model source {name!r} is declared twice in {MODEL_SOURCES_GROUP}: "
            f"{', '.join(ep.value for ep in matches)}. Fix: uninstall one of the packages"
        )
    ep = matches[0]
    origin = f"entry point {ep.value}"
    try:
        table = ep.load()
    except Exception as exc:
        raise RegistryError(
            f"model source {name!r}: loading {ep.value} failed ({type(exc).__name__}: {exc}). "
            f"Fix: reinstall the package that provides it"
        ) from exc
    return ModelSource.from_table(name, table, origin=origin)


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=MODEL_SOURCES_GROUP)
