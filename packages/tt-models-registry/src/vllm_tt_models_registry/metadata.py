"""A bundle's ``vllm_metadata.json``: its JSON schema and its typed form.

The schema is the single statement of the format (``vllm-tt-models schema`` prints it);
validation errors are turned into messages naming the bundle folder, the field and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.errors import BundleError, Problem
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
    """Raise one :class:`BundleError` naming every problem of the metadata, not just the first."""
    import jsonschema  # only bundles need it; keeps plugin start cheap without them

    if not isinstance(raw, dict):
        raise BundleError(
            folder,
            METADATA_FILE,
            f"must hold a JSON object, got {type(raw).__name__}",
            'write {"arch": "...", "main_class": "module:Class"}',
        )
    validator = jsonschema.Draft202012Validator(METADATA_SCHEMA)
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.path), list(e.path)))
    problems = [_problem(error, raw) for error in errors]
    if problems:
        raise BundleError.of(folder, sorted(problems, key=_field_order))


def _problem(error: Any, raw: dict[str, Any]) -> Problem:
    if error.validator == "required":
        missing = next(name for name in METADATA_SCHEMA["required"] if f"{name!r}" in error.message)
        return Problem(_where(missing), "missing (it is required)", _FIELDS[missing][1])
    top = str(error.path[0]) if error.path else ""
    if error.validator == "additionalProperties" and not error.path:
        unknown = sorted(set(raw) - set(_FIELDS))
        return Problem(
            METADATA_FILE,
            f"unknown field(s) {', '.join(map(repr, unknown))}",
            f"{_did_you_mean(unknown)}remove them or fix their spelling; allowed fields: "
            f"{', '.join(_FIELDS)}",
        )
    if top == "capabilities":
        return Problem(_where(top), _capability_problem(error), _FIELDS[top][1])
    value = raw.get(top)
    if top == "main_class" and isinstance(value, str):
        return Problem(
            _where(top),
            f"{value!r} is not of the form 'module:Class'",
            f'write "main_class": "{target_hint(value)}"',
        )
    return Problem(_where(top), f"{value!r} is not valid ({error.message})", _FIELDS[top][1])


def _did_you_mean(unknown: list[str]) -> str:
    guesses = [
        f"rename {name!r} to {match[0]!r}"
        for name in unknown
        if (match := difflib.get_close_matches(name, _FIELDS, 1))
    ]
    return f"{', '.join(guesses)}; otherwise " if guesses else ""


def _field_order(problem: Problem) -> int:
    """Problems in the order of the fields in the schema (the whole file's problems first)."""
    names = [_where(name) for name in _FIELDS]
    return names.index(problem.field) + 1 if problem.field in names else 0


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
