"""``vllm-tt-models``: list the registered TT architectures, check a bundle, print the schema.

``check`` runs exactly the checks startup runs, so its messages are the ones vLLM would fail
with, and its exit code (0 ok, 1 broken) suits CI for bundle authors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_tt_models_registry.bundle import Bundle, load_bundle, load_bundles
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.envs import TT_MESH_BACKEND
from vllm_tt_models_registry.errors import RegistryError
from vllm_tt_models_registry.metadata import METADATA_FILE, METADATA_SCHEMA
from vllm_tt_models_registry.registry import TTNN_BACKEND, RegisteredModel, load_registry
from vllm_tt_models_registry.settings import Setting, argument, environment
from vllm_tt_models_registry.sources import installed_source_names


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
    check.add_argument("dir", type=Path, metavar="DIR", help=f"a folder holding {METADATA_FILE}, or their parent")
    check.set_defaults(run=_check)
    schema = commands.add_parser("schema", help=f"print the JSON schema of {METADATA_FILE}")
    schema.set_defaults(run=_schema)
    return parser


def _list(args: argparse.Namespace) -> int:
    backend, setting = _backend(args)
    registry = load_registry(backend, backend_setting=setting)
    rows = [_describe(model) for model in registry.entries()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    summary = registry.startup_summary()
    print(summary[0])
    print(f"  (mesh backend {backend!r} from {_origin(args)}; {_other_backends(backend)})")
    if not registry.builtins_enabled:
        print(summary[1])
    for error, count in Counter(row["error"] for row in rows if row["error"]).items():
        print(f"\nnote: {count} model classes are not importable here ({error});")
        print("  their capabilities below are only what the registry declares for them.")
        if "No module named 'models'" in error:
            print(f"  tt-metal's models package is not installed: this machine cannot serve them; "
                  f"{_other_backends(backend)}")
    for row in rows:
        print(f"\n{row['arch']}")
        print(f"  source:       {row['source']}")
        print(f"  target:       {row['target']}")
        if row["capabilities"] is not None:
            changed = {k: v for k, v in row["capabilities"].items() if _DEFAULTS.get(k) != v}
            print(f"  capabilities: {_flags(changed) if changed else 'defaults'}")
        else:
            declared = _flags(row["declared"]) if row["declared"] else "none"
            print(f"  capabilities: declared: {declared} (class not importable here)")
    return 0


def _backend(args: argparse.Namespace) -> tuple[str, Setting]:
    """The backend to describe and the input it came from (named by errors about it)."""
    if args.backend is not None:
        return args.backend, argument("--backend")
    return TT_MESH_BACKEND.read(), environment(TT_MESH_BACKEND.name)


def _origin(args: argparse.Namespace) -> str:
    if args.backend is not None:
        return "argument --backend"
    if os.environ.get(TT_MESH_BACKEND.name, "").strip():
        return f"environment variable {TT_MESH_BACKEND.name}"
    return f"the default: neither --backend nor {TT_MESH_BACKEND.name} is set"


def _other_backends(backend: str) -> str:
    others = [name for name in (TTNN_BACKEND, *installed_source_names()) if name != backend]
    if not others:
        return "no other backend is installed"
    shown = ", ".join(f"vllm-tt-models list --backend {name}" for name in others)
    return f"other backends here: {shown}"


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
        caps = asdict(model.listed_capabilities())
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
    bundles = [load_bundle(folder)] if (folder / METADATA_FILE).is_file() else load_bundles(folder, argument("DIR"))
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
