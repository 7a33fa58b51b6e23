"""``vllm-tt-models``: list the registered TT architectures, check a bundle, print the schema.

``check`` runs exactly the checks startup runs, so its messages are the ones vLLM would fail
with, and its exit code (0 ok, 1 broken) suits CI for bundle authors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_tt_models_registry.bundle import Bundle, load_bundle, load_bundles
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.envs import TT_MESH_BACKEND
from vllm_tt_models_registry.errors import RegistryError
from vllm_tt_models_registry.metadata import METADATA_FILE, METADATA_SCHEMA
from vllm_tt_models_registry.registry import RegisteredModel, load_registry


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-tt-models", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    listing = commands.add_parser("list", help="every registered TT architecture and its source")
    listing.add_argument(
        "--backend",
        default=None,
        help="mesh backend: ttnn, or a model source such as host (default: $TT_MESH_BACKEND or ttnn)",
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=_list)
    check = commands.add_parser(
        "check", help="validate a bundle folder (or a folder of bundles) as startup would"
    )
    check.add_argument("dir", type=Path, help=f"a folder holding {METADATA_FILE}, or their parent")
    check.set_defaults(run=_check)
    schema = commands.add_parser("schema", help=f"print the JSON schema of {METADATA_FILE}")
    schema.set_defaults(run=_schema)
    return parser


def _list(args: argparse.Namespace) -> int:
    backend = args.backend or TT_MESH_BACKEND.read()
    registry = load_registry(backend)
    rows = [_describe(model) for model in registry.entries()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(registry.startup_summary()[0])
    if not registry.builtins_enabled:
        print(registry.startup_summary()[1])
    for row in rows:
        print(f"\n{row['arch']}")
        print(f"  source:       {row['source']}")
        print(f"  target:       {row['target']}")
        if row["capabilities"] is not None:
            changed = {k: v for k, v in row["capabilities"].items() if _DEFAULTS.get(k) != v}
            print(f"  capabilities: {_flags(changed) if changed else 'defaults'}")
        else:
            declared = _flags(row["declared"]) if row["declared"] else "none"
            print(f"  capabilities: class not importable here ({row['error']}); declared: {declared}")
    return 0


_DEFAULTS = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(ModelCapabilities()).items()}


def _describe(model: RegisteredModel) -> dict[str, Any]:
    row: dict[str, Any] = {
        "arch": model.arch,
        "source": model.source,
        "target": model.target,
        "declared": {k: list(v) if isinstance(v, tuple) else v for k, v in model.overrides},
        "capabilities": None,
        "error": None,
    }
    try:
        caps = asdict(model.capabilities())
    except RegistryError as exc:
        cause = exc.__cause__ or exc
        row["error"] = f"{type(cause).__name__}: {cause}"
    else:
        row["capabilities"] = {k: list(v) if isinstance(v, tuple) else v for k, v in caps.items()}
    return row


def _flags(caps: dict[str, Any]) -> str:
    shown = [k if v is True else f"{k}={v}" for k, v in caps.items() if v is not False]
    return ", ".join(shown) or "all off"


def _check(args: argparse.Namespace) -> int:
    folder: Path = args.dir
    bundles = [load_bundle(folder)] if (folder / METADATA_FILE).is_file() else load_bundles(folder)
    if not bundles:
        print(f"error: {folder} holds no bundle (no subfolder with {METADATA_FILE})", file=sys.stderr)
        return 1
    for bundle in bundles:
        print(_ok(bundle))
    return 0


def _ok(bundle: Bundle) -> str:
    caps = bundle.capabilities.non_defaults()
    return (
        f"ok: {bundle.folder}: {bundle.arch} -> {bundle.target} "
        f"(capabilities: {_flags(caps) if caps else 'defaults'})"
    )


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(METADATA_SCHEMA, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
