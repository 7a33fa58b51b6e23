"""A bundle's ``vllm_metadata.json``: its JSON schema and its typed form.

The schema is the single statement of the format (``vllm-tt-models schema`` prints it);
validation errors are turned into messages naming the bundle folder, the field and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.errors import BundleError
from vllm_tt_models_registry.names import ARCH_PATTERN, TARGET_PATTERN, target_hint

METADATA_FILE = "vllm_metadata.json"

_FIELDS: Mapping[str, tuple[dict[str, Any], str]] = {
    "arch": (
        {"type": "string", "pattern": ARCH_PATTERN},
        'set "arch" to the Hugging Face architecture the bundle serves, as in the checkpoint\'s '
        'config.json "architectures" (e.g. "LlamaForCausalLM")',
    ),
    "main_class": (
        {"type": "string", "pattern": TARGET_PATTERN},
        'set "main_class" to "module:Class", where module.py (or a module/ package) sits in '
        "the bundle folder or is installed",
    ),
    "capabilities": (
        ModelCapabilities.json_schema(),
        '"capabilities" is an object of the ModelCapabilities flags (see docs/bundles.md); '
        "fix or drop the key",
    ),
    "description": ({"type": "string"}, '"description" is free text; make it a string'),
    "min_plugin_version": (
        {"type": "string"},
        '"min_plugin_version" is a version string such as "0.1.0"',
    ),
}

METADATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "vllm-tt model bundle metadata (vllm_metadata.json)",
    "type": "object",
    "required": ["arch", "main_class"],
    "additionalProperties": False,
    "properties": {name: spec for name, (spec, _) in _FIELDS.items()},
}


@dataclass(frozen=True)
class BundleMetadata:
    """The validated content of one ``vllm_metadata.json``."""

    arch: str
    main_class: str
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    """Declared by the bundle; merged over the adapter class's own ``model_capabilities``."""
    description: str = ""
    min_plugin_version: str | None = None

    @classmethod
    def read(cls, folder: Path) -> BundleMetadata:
        """Read and validate ``folder/vllm_metadata.json``."""
        path = folder / METADATA_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BundleError(
                folder,
                METADATA_FILE,
                f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                "fix the JSON syntax (a JSON linter shows the spot)",
            ) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError(
                folder, METADATA_FILE, f"cannot be read ({exc})", "make it a readable UTF-8 file"
            ) from exc
        return cls.from_dict(raw, folder=folder)

    @classmethod
    def from_dict(cls, raw: Any, *, folder: Path) -> BundleMetadata:
        _validate(raw, folder)
        return cls(
            arch=raw["arch"],
            main_class=raw["main_class"],
            capabilities=dict(raw.get("capabilities", {})),
            description=raw.get("description", ""),
            min_plugin_version=raw.get("min_plugin_version"),
        )


def _validate(raw: Any, folder: Path) -> None:
    import jsonschema  # only bundles need it; keeps plugin start cheap without them

    validator = jsonschema.Draft202012Validator(METADATA_SCHEMA)
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.path), list(e.path)))
    if not errors:
        return
    error = errors[0]
    if not isinstance(raw, dict):
        raise BundleError(
            folder,
            METADATA_FILE,
            f"must hold a JSON object, got {type(raw).__name__}",
            'write {"arch": "...", "main_class": "module:Class"}',
        )
    if error.validator == "required":
        missing = [name for name in METADATA_SCHEMA["required"] if name not in raw][0]
        raise BundleError(folder, _where(missing), "missing (it is required)", _FIELDS[missing][1])
    top = str(error.path[0]) if error.path else ""
    if error.validator == "additionalProperties" and not error.path:
        unknown = sorted(set(raw) - set(_FIELDS))
        raise BundleError(
            folder,
            METADATA_FILE,
            f"unknown field(s) {', '.join(map(repr, unknown))}",
            f"remove them or fix their spelling; allowed fields: {', '.join(_FIELDS)}",
        )
    if top == "capabilities":
        raise BundleError(folder, _where(top), _capability_problem(error), _FIELDS[top][1])
    value = raw.get(top)
    if top == "main_class" and isinstance(value, str):
        raise BundleError(
            folder,
            _where(top),
            f"{value!r} is not of the form 'module:Class'",
            f'write "main_class": "{target_hint(value)}"',
        )
    raise BundleError(folder, _where(top), f"{value!r} is not valid ({error.message})", _FIELDS[top][1])


def _capability_problem(error: Any) -> str:
    if error.validator == "additionalProperties":
        known = ", ".join(error.schema["properties"])
        unknown = sorted(set(error.instance) - set(error.schema["properties"]))
        return f"unknown capability {', '.join(map(repr, unknown))} (known: {known})"
    if len(error.path) >= 2:
        return f"{error.path[1]!r}: {error.message}"
    return error.message


def _where(name: str) -> str:
    return f"{METADATA_FILE} field {name!r}"
