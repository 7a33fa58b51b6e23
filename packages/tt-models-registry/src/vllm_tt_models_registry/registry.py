"""The TT model registry: which class serves each ``TT<Arch>``, and where that choice came from.

Precedence, highest first: bundles from ``EXTRA_MODELS_DIR``, then (unless
``TT_VLLM_BUILTIN_MODELS=0``) the mesh backend's model source (``host``), then the builtin
tt-metal table. Entries stay lazy ``module:Class`` strings; only bundles are imported (and
checked) when the registry is built.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_tt_models_registry.builtin import BUILTIN_FAMILIES
from vllm_tt_models_registry.bundle import load_bundles
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_models_registry.envs import EXTRA_MODELS_DIR, TT_VLLM_BUILTIN_MODELS
from vllm_tt_models_registry.errors import BundleError, ContractError, RegistryError
from vllm_tt_models_registry.names import split_target, tt_arch_name
from vllm_tt_models_registry.settings import Setting
from vllm_tt_models_registry.sources import BACKEND_SETTING, ModelSource, load_source

BUILTIN = "builtin"
BUNDLE_PREFIX = "bundle:"
TTNN_BACKEND = "ttnn"
"""The mesh backend served by the builtin tt-metal table alone (no model source)."""


@dataclass(frozen=True)
class RegisteredModel:
    """One TT architecture and the class serving it, as a lazy ``module:Class`` target."""

    arch: str
    target: str
    source: str
    """``builtin``, ``bundle:<folder>`` or the name of a model source (``host``)."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """Capabilities the registration declares on top of the class's own."""
    stated: ModelCapabilities | None = None
    """What the model source states the class declares, for listings that import no model
    code; serving reads the class itself (the source's tests keep the two equal)."""

    def load_class(self) -> type:
        """Import the class and check it against the model contract."""
        module_name, class_name = split_target(self.target)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise self._error(
                f"cannot import {module_name!r} ({type(exc).__name__}: {exc})", self._import_fix()
            ) from exc
        model_cls = getattr(module, class_name, None)
        if model_cls is None:
            raise self._error(f"module {module_name!r} has no {class_name!r}", self._import_fix())
        try:
            check_model_class(model_cls, owner=self.describe(), overrides=dict(self.overrides))
        except ContractError as exc:
            raise self._error(exc.problem, exc.fix) from exc
        return model_cls

    def capabilities(self) -> ModelCapabilities:
        """What the model can do: its class's ``model_capabilities`` plus the overrides."""
        return ModelCapabilities.of(self.load_class(), dict(self.overrides))

    def listed_capabilities(self) -> ModelCapabilities:
        """The capabilities a listing shows: the source's statement when it has one (no
        import), else the class's own (imports it)."""
        if self.stated is None:
            return self.capabilities()
        return ModelCapabilities.from_mapping(
            {**self.stated.non_defaults(), **dict(self.overrides)}, owner=self.describe()
        )

    def describe(self) -> str:
        return f"{self.arch} ({self.source}: {self.target})"

    @property
    def bundle_folder(self) -> Path | None:
        if self.source.startswith(BUNDLE_PREFIX):
            return Path(self.source.removeprefix(BUNDLE_PREFIX))
        return None

    def _import_fix(self) -> str:
        if self.bundle_folder is not None:
            return "fix the bundle (vllm-tt-models check shows the same error)"
        if self.source == BUILTIN:
            return (
                "install tt-metal's models package (put the tt-metal checkout on PYTHONPATH), "
                f"or serve {self.arch} from a bundle in EXTRA_MODELS_DIR"
            )
        return f"reinstall the package providing the model source {self.source!r}"

    def _error(self, problem: str, fix: str) -> RegistryError:
        if self.bundle_folder is not None:
            return BundleError(self.bundle_folder, f"main_class {self.target!r}", problem, fix)
        return RegistryError(f"{self.describe()}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class TTModelRegistry:
    """The resolved table: one :class:`RegisteredModel` per TT architecture."""

    models: tuple[RegisteredModel, ...]
    backend: str = TTNN_BACKEND
    builtins_enabled: bool = True
    shadowed: tuple[tuple[str, str], ...] = ()
    """``(arch, source)`` pairs a higher-precedence source won over, for the startup log."""

    def __post_init__(self) -> None:
        archs = [m.arch for m in self.models]
        if len(archs) != len(set(archs)):
            raise RegistryError(f"duplicate architectures in the registry: {archs}")

    def entries(self) -> tuple[RegisteredModel, ...]:
        return self.models

    def archs(self) -> tuple[str, ...]:
        return tuple(m.arch for m in self.models)

    def __contains__(self, arch: object) -> bool:
        return isinstance(arch, str) and any(m.arch == tt_arch_name(arch) for m in self.models)

    def __iter__(self) -> Iterator[RegisteredModel]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    def resolve(self, tt_arch: str) -> RegisteredModel:
        """The model registered for ``tt_arch`` (an HF name is prefixed with TT first)."""
        arch = tt_arch_name(tt_arch)
        for model in self.models:
            if model.arch == arch:
                return model
        registered = ", ".join(sorted(self.archs())) or "none"
        raise RegistryError(
            f"no TT model is registered for {arch!r} (mesh backend {self.backend!r}); "
            f"registered: {registered}. Fix: {self._missing_hint(arch)}"
        )

    def register_with_vllm(self) -> None:
        """Register every entry with vLLM in the lazy string form (nothing is imported)."""
        import vllm

        for model in self.models:
            vllm.ModelRegistry.register_model(model.arch, model.target)

    def startup_summary(self) -> list[str]:
        """What the startup log says once: the source of every TT arch, and what was off."""
        lines = [f"TT models for mesh backend {self.backend!r}: {len(self.models)} architectures"]
        if not self.builtins_enabled:
            lines.append(
                "TT_VLLM_BUILTIN_MODELS=0: builtin models are off; only bundles from "
                "EXTRA_MODELS_DIR are served"
            )
        by_source: dict[str, list[str]] = {}
        for model in self.models:
            by_source.setdefault(model.source, []).append(model.arch)
        lost: dict[str, list[str]] = {}
        for arch, source in self.shadowed:
            lost.setdefault(arch, []).append(source)
        for source, archs in by_source.items():
            shown = [f"{a} (over {', '.join(lost[a])})" if a in lost else a for a in archs]
            lines.append(f"  {source}: {', '.join(shown)}")
        return lines

    def _missing_hint(self, arch: str) -> str:
        builtin_archs = {tt_arch_name(a) for fam in BUILTIN_FAMILIES for a in fam.archs}
        if not self.builtins_enabled and arch in builtin_archs:
            return (
                "unset TT_VLLM_BUILTIN_MODELS (it is 0, which turns the builtin models off), "
                "or add a bundle for it to EXTRA_MODELS_DIR"
            )
        hint = f"add a bundle serving {arch.removeprefix('TT')} to EXTRA_MODELS_DIR (docs/bundles.md)"
        if not self.builtins_enabled:
            hint += ", or unset TT_VLLM_BUILTIN_MODELS"
        return hint


def load_registry(
    backend: str = TTNN_BACKEND,
    *,
    environ: Mapping[str, str] | None = None,
    sources: Mapping[str, ModelSource] | None = None,
    backend_setting: Setting = BACKEND_SETTING,
) -> TTModelRegistry:
    """Build the registry for mesh ``backend`` from the environment (``os.environ`` default).

    ``sources`` replaces the entry-point lookup of model sources (for tests and embedding);
    ``backend_setting`` is the input ``backend`` came from, named by the unknown-backend error.
    Bad variant or flag values raise :class:`RegistryError`; broken bundles :class:`BundleError`.
    """
    env = os.environ if environ is None else environ
    builtins_enabled = TT_VLLM_BUILTIN_MODELS.read(env)
    chosen = {fam.name: fam.chosen(env) for fam in BUILTIN_FAMILIES}  # validates the variants
    models: dict[str, RegisteredModel] = {}
    shadowed: list[tuple[str, str]] = []

    def add(model: RegisteredModel) -> None:
        if model.arch in models:
            shadowed.append((model.arch, model.source))
        else:
            models[model.arch] = model

    models_dir = EXTRA_MODELS_DIR.read(env)
    if models_dir is not None:
        for bundle in load_bundles(models_dir):
            add(
                RegisteredModel(
                    bundle.arch, bundle.target, bundle.source, _frozen(bundle.metadata.capabilities)
                )
            )
    if builtins_enabled:
        if backend != TTNN_BACKEND:
            source = _source(backend, sources, backend_setting)
            for arch, target in source.targets.items():
                add(RegisteredModel(arch, target, source.name, stated=source.capabilities.get(arch)))
        for fam in BUILTIN_FAMILIES:
            variant = chosen[fam.name]
            for hf_arch in fam.archs:
                add(
                    RegisteredModel(
                        tt_arch_name(hf_arch), variant.target, BUILTIN, _frozen(variant.capabilities)
                    )
                )
    return TTModelRegistry(tuple(models.values()), backend, builtins_enabled, tuple(shadowed))


def _source(backend: str, sources: Mapping[str, ModelSource] | None, setting: Setting) -> ModelSource:
    if sources is None:
        return load_source(backend, setting=setting)
    if backend in sources:
        return sources[backend]
    return load_source(backend, eps=(), setting=setting)  # raises the "no such model source" error


def _frozen(capabilities: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(capabilities.items()))
