"""Model bundles: user models added through ``EXTRA_MODELS_DIR`` without touching our source.

Each subfolder of ``EXTRA_MODELS_DIR`` holding ``vllm_metadata.json`` is a bundle. Loading one
validates the metadata, refuses modules that would shadow installed packages, imports the
adapter class and checks it against the model contract, so a broken bundle fails at startup
with a message naming the folder, the field or method and the fix.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_tt_models_registry.bundle_import import bundle_finder, installed_origin
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_models_registry.errors import BundleError, ContractError
from vllm_tt_models_registry.metadata import METADATA_FILE, BundleMetadata
from vllm_tt_models_registry.names import split_target, tt_arch_name
from vllm_tt_models_registry.settings import ENVIRONMENT, Setting, environment

DISTRIBUTION = "vllm-tt-models-registry"
"""Whose version ``min_plugin_version`` is compared with (it interprets bundles)."""
MODELS_DIR_SETTING = environment("EXTRA_MODELS_DIR")


@dataclass(frozen=True)
class Bundle:
    """A bundle that passed every check: its adapter class imports and fulfils the contract."""

    folder: Path
    metadata: BundleMetadata
    modules: tuple[str, ...]
    """Top-level modules the folder provides (importable by these names only)."""
    capabilities: ModelCapabilities

    @property
    def arch(self) -> str:
        return tt_arch_name(self.metadata.arch)

    @property
    def target(self) -> str:
        return self.metadata.main_class

    @property
    def source(self) -> str:
        return f"bundle:{self.folder}"


def find_bundle_folders(models_dir: Path, setting: Setting = MODELS_DIR_SETTING) -> list[Path]:
    """Subfolders of ``models_dir`` holding ``vllm_metadata.json``, sorted by name.

    ``setting`` is where ``models_dir`` came from (the variable, or a CLI argument), for errors.
    """
    if (models_dir / METADATA_FILE).is_file():
        raise BundleError(
            models_dir,
            str(setting),
            "points at a bundle itself, not at the folder holding bundles",
            f"set {setting.spelled(models_dir.parent)}",
        )
    if not models_dir.is_dir():
        problem = "is not a directory" if models_dir.exists() else "is not a directory (it does not exist)"
        fix = (
            f"point {setting.name} at a folder of bundles, or unset it"
            if setting.kind == ENVIRONMENT
            else f"pass a folder holding {METADATA_FILE}, or a folder of such bundle folders"
        )
        raise BundleError(models_dir, str(setting), problem, fix)
    return sorted(
        entry
        for entry in models_dir.iterdir()
        if entry.is_dir() and not entry.name.startswith(".") and (entry / METADATA_FILE).is_file()
    )


def load_bundles(models_dir: Path, setting: Setting = MODELS_DIR_SETTING) -> list[Bundle]:
    """Load every bundle under ``models_dir``; two bundles may not serve the same arch."""
    bundles: list[Bundle] = []
    by_arch: dict[str, Bundle] = {}
    for folder in find_bundle_folders(models_dir, setting):
        bundle = load_bundle(folder)
        earlier = by_arch.get(bundle.arch)
        if earlier is not None:
            raise BundleError(
                folder,
                f"{METADATA_FILE} field 'arch'",
                f"{bundle.arch} is also served by bundle {earlier.folder}",
                "remove one of the two bundles, or give them different architectures",
            )
        by_arch[bundle.arch] = bundle
        bundles.append(bundle)
    return bundles


def load_bundle(folder: Path) -> Bundle:
    """Validate one bundle folder and import its adapter class (see the module docstring)."""
    folder = folder.resolve()
    meta = BundleMetadata.read(folder)
    _check_version(folder, meta)
    modules = _top_level_modules(folder)
    finder = bundle_finder()
    try:
        for name in modules:
            _claim(folder, name)
        model_cls = _import_class(folder, meta.main_class, modules)
        try:
            capabilities = check_model_class(model_cls, owner=str(folder), overrides=meta.capabilities)
        except ContractError as exc:
            raise BundleError(folder, f"main_class {meta.main_class!r}", exc.problem, exc.fix) from exc
    except BundleError:
        finder.release(folder)
        raise
    return Bundle(folder, meta, modules, capabilities)


def _check_version(folder: Path, meta: BundleMetadata) -> None:
    if meta.min_plugin_version is None:
        return
    field = f"{METADATA_FILE} field 'min_plugin_version'"
    try:
        wanted = Version(meta.min_plugin_version)
    except InvalidVersion as exc:
        raise BundleError(
            folder,
            field,
            f"{meta.min_plugin_version!r} is not a version",
            'write a version such as "0.1.0"',
        ) from exc
    installed = Version(importlib_metadata.version(DISTRIBUTION))
    if wanted > installed:
        raise BundleError(
            folder,
            field,
            f"the bundle needs {DISTRIBUTION} >= {wanted}, but {installed} is installed",
            f"upgrade vllm-tt to {wanted} or newer, or use a bundle built for {installed}",
        )


def _top_level_modules(folder: Path) -> tuple[str, ...]:
    names = []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.suffix == ".py" and entry.stem.isidentifier():
            names.append(entry.stem)
        elif entry.is_dir() and entry.name.isidentifier() and (entry / "__init__.py").is_file():
            names.append(entry.name)
    return tuple(names)


def _claim(folder: Path, name: str) -> None:
    """Make ``name`` importable from ``folder``, unless something else already owns it."""
    finder = bundle_finder()
    other = finder.owner(name)
    if other is not None and other != folder:
        raise BundleError(
            folder,
            f"module {name!r}",
            f"bundle {other} already provides a module of that name",
            f"rename {name} in one of the two bundles (e.g. {name}_{folder.name})",
        )
    origin = installed_origin(name, folder)
    if origin is not None:
        raise BundleError(
            folder,
            f"module {name!r}",
            f"it would shadow the installed module {name!r} ({origin})",
            f"rename the bundle's {name} to a name no installed package uses "
            f"(e.g. {folder.name}_{name}) and update main_class",
        )
    finder.claim(name, folder)


def _import_class(folder: Path, main_class: str, modules: tuple[str, ...]) -> type:
    field = f"main_class {main_class!r}"
    module_name, class_name = split_target(main_class)
    top = module_name.partition(".")[0]
    importlib.invalidate_caches()  # the folder may have changed since it was last looked at
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            found = ", ".join(modules) or "no Python modules"
            raise BundleError(
                folder,
                field,
                f"module {module_name!r} cannot be found: it is neither in the bundle folder "
                f"(which has {found}) nor installed",
                f"add {top}.py (or a {top}/ package) to the bundle, or fix the module name",
            ) from exc
        raise _import_failed(folder, field, module_name, exc) from exc
    except Exception as exc:
        raise _import_failed(folder, field, module_name, exc) from exc
    model_cls = getattr(module, class_name, None)
    if model_cls is None:
        raise BundleError(
            folder,
            field,
            f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no {class_name!r}",
            f"define class {class_name} there or fix the class name",
        )
    return model_cls


def _import_failed(folder: Path, field: str, module_name: str, exc: BaseException) -> BundleError:
    return BundleError(
        folder,
        field,
        f"importing {module_name!r} failed: {type(exc).__name__}: {exc}",
        "fix that error in the bundle's code, or install what it imports",
    )
