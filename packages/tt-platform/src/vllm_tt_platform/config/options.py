"""``TTConfig``: every ``--additional-config.tt.<key>`` option, typed, parsed and checked once.

This module is the single list of options: each field carries its type, default, allowed
values, environment variable and docstring; the docs' configuration reference is generated
from it (``python scripts/gen_docs.py``).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from vllm_tt_scheduler.options import BLOCK_TOKENS, ITL_SLO_MS, PREFILL_BURST, PREFILL_HOLD, OptionSpec

from vllm_tt_platform import envs
from vllm_tt_platform.config.pooling_shapes import parse_shapes
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.backend import option_tables

KEY_PREFIX = "--additional-config.tt."
INTERNAL_PREFIX = "_"
"""Keys starting with ``_`` are written by the platform itself for other processes and
packages (e.g. the scheduler); users never set them."""


def option(doc: str, *, choices: tuple[str, ...] = (), env: str | None = None,
         minimum: float | None = None, choices_from: Callable[[], tuple[str, ...]] | None = None,
         check: Callable[[str], object] | None = None, allowed: str = "") -> dict[str, Any]:
    """A field's metadata (here, and in a mesh backend's own option table): ``check`` validates a
    free-form string (raising ``ValueError`` with the accepted forms); ``allowed`` describes those
    forms in the generated reference."""
    return {"doc": doc, "choices": choices, "env": env, "minimum": minimum, "choices_from": choices_from,
            "check": check, "allowed": allowed}


def _scheduler_opt(spec: OptionSpec[Any]) -> Any:
    """A field the scheduler declares (``vllm_tt_scheduler.options``): default, minimum and doc
    are the spec's, and the field's annotation is ``spec.kind`` (``test_config`` checks)."""
    return field(default=spec.default, metadata={**option(spec.doc, minimum=spec.minimum), "scheduler": spec})


def _fabric_configs() -> tuple[str, ...]:
    import ttnn

    return tuple(ttnn.FabricConfig.__members__)


def _fabric_reliability_modes() -> tuple[str, ...]:
    import ttnn

    return tuple(ttnn.FabricReliabilityMode.__members__)


@dataclass(frozen=True)
class TTConfig:
    """The TT backend's options, as resolved from ``additional_config["tt"]`` and the environment."""

    mesh_backend: str = field(default="ttnn", metadata=option(
        "Which mesh backend runs the model programs: `ttnn` opens a real Tenstorrent mesh; "
        "`host` emulates the device contract on the CPU (tests, CI, development).",
        choices=("ttnn", "host"), env="TT_MESH_BACKEND"))
    sample_on_device_mode: str | None = field(default=None, metadata=option(
        "Sample on the device for `all` steps or `decode_only`; unset samples on the host. "
        "Needs a model declaring `supports_sample_on_device`; batches the device cannot express "
        "fall back to the host sampler.", choices=("all", "decode_only")))
    always_compat_sampling: bool = field(default=False, metadata=option(
        "Force vLLM's host sampler for every batch (debugging, A/B checks)."))
    trace_mode: str = field(default="all", metadata=option(
        "Which programs replay captured traces: `all`, `decode_only` or `none`.",
        choices=("all", "decode_only", "none")))
    enable_model_warmup: bool = field(default=True, metadata=option(
        "Compile and capture traces before serving. Without warmup, trace_mode must be `none`."))
    trace_region_size: int = field(default=50_000_000, metadata=option(
        "Bytes of device DRAM reserved for traces when tracing is on.", minimum=0))
    worker_l1_size: int | None = field(default=None, metadata=option(
        "Worker L1 size in bytes passed to `ttnn.open_mesh_device`; unset keeps ttnn's default.",
        minimum=1))
    l1_small_size: int | None = field(default=None, metadata=option(
        "L1 small region in bytes passed to `ttnn.open_mesh_device`; unset keeps ttnn's default.",
        minimum=1))
    fabric_config: str | None = field(default=None, metadata=option(
        "A `ttnn.FabricConfig` member name; unset picks by cluster: Galaxy FABRIC_1D_RING, "
        "Blackhole Galaxy FABRIC_2D_TORUS_XY, other multi-chip FABRIC_1D, one chip none.",
        choices_from=_fabric_configs))
    fabric_reliability_mode: str = field(default="STRICT_INIT", metadata=option(
        "A `ttnn.FabricReliabilityMode` member name.", choices_from=_fabric_reliability_modes))
    dispatch_core_axis: str | None = field(default=None, metadata=option(
        "Axis of the dispatch cores: `row` or `col`; unset keeps ttnn's default.",
        choices=("row", "col")))
    optimizations: str | None = field(default=None, metadata=option(
        "Precision preset forwarded to the model's `initialize_vllm_model`.",
        choices=("performance", "accuracy")))
    readback_timeout_s: float = field(default=60.0, metadata=option(
        "Seconds the runner waits for a decode readback before it declares the device hung: "
        "the engine then stops with a `TTReadbackTimeoutError` (vLLM answers the requests in "
        "flight with an error and the API server exits) instead of hanging. Raise it only if "
        "one decode step can legitimately take longer.", minimum=0.1))
    prefill_burst: int = _scheduler_opt(PREFILL_BURST)
    prefill_hold: float = _scheduler_opt(PREFILL_HOLD)
    block_tokens: int = _scheduler_opt(BLOCK_TOKENS)
    mixed_steps: bool = field(default=False, metadata=option(
        "Mixed steps: with decodes running, a step also computes one prompt chunk, sized from the "
        "model's captured `mixed_shapes`, in one program, so prompts no longer stall decodes. Needs "
        "a model declaring `mixed_shapes`; not with lanes, speculative decoding or `block_tokens`. "
        "See docs/scheduling.md."))
    itl_slo_ms: float = _scheduler_opt(ITL_SLO_MS)
    step_cost: str | None = field(default=None, metadata=option(
        "Step cost model handed to the phase scheduler, which then decides prefill versus decode "
        "and how many prompts share a prefill step by modelled device time (the cost-aware "
        "policy; `prefill_hold` is then unused). Unset: the step-counted policy. "
        "See docs/scheduling.md.", check=parse_device_time,
        allowed="`served`; `llama-3.1-8b`, `llama-3.3-70b`; `<model>@<MESH_DEVICE preset>`; a duration (`40ms`)"))
    pooling_shapes: str | None = field(default=None, metadata=option(
        "Pooling models (`--runner pooling`): the `BATCHxLENGTH` shapes of the prefill-only "
        "programs warmup captures, comma-separated (`1x128,8x128,4x512`). A prompt is padded to "
        "the shortest length holding it; one longer than the longest shape is refused (HTTP 400). "
        "Unset: batches 1, 2, 4, 8 (up to `--max-num-seqs`) times lengths 32, 64, 96, 128, 192, 256, 384, ... up to "
        "`--max-model-len`.", check=parse_shapes, allowed="`BATCHxLENGTH[,BATCHxLENGTH...]`"))
    provenance: Mapping[str, str] = field(default_factory=dict, compare=False, metadata={"internal": True})
    """Where each option's value came from: `set`, `env` or `default`."""
    backend_options: Mapping[str, Any] = field(default_factory=dict, compare=False, metadata={"internal": True})
    """The values of the keys the chosen mesh backend declares in its own option table
    (``mesh.backend.option_tables``, e.g. the host backend's ``host_*``), parsed like the rest."""

    @classmethod
    def options(cls) -> list[Any]:
        return [f for f in fields(cls) if not f.metadata.get("internal")]

    @classmethod
    def from_sources(cls, tt: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> TTConfig:
        """Parse the ``tt`` section of ``additional_config`` plus the environment.

        Raises :class:`TTConfigError` for an unknown key (with the closest valid one), a wrong
        type or a value outside the allowed set.
        """
        environ = os.environ if environ is None else environ
        tt = dict(tt or {})
        known = {f.name: f for f in cls.options()}
        backend_keys = {f.name: (backend, f) for backend, table in option_tables().items() for f in fields(table)}
        for key in tt:
            if key.startswith(INTERNAL_PREFIX):
                continue
            if key not in known and key not in backend_keys:
                keys = [*known, *backend_keys]
                close = difflib.get_close_matches(key, keys, n=1)
                hint = f"did you mean {KEY_PREFIX}{close[0]}?" if close else "remove it"
                raise TTConfigError(
                    f"{KEY_PREFIX}{key}", tt[key], f"one of the keys {', '.join(keys)}", hint
                )
        values, provenance = _read(known, tt, environ)
        mesh_backend = values.get("mesh_backend", cls.mesh_backend)
        extra, extra_provenance = _read({name: f for name, (_, f) in backend_keys.items()}, tt, environ)
        for name, value in extra.items():
            backend = backend_keys[name][0]
            if value and backend != mesh_backend:
                raise TTConfigError(
                    f"{KEY_PREFIX}{name}", value, f"unset unless mesh_backend is `{backend}`",
                    f"remove {KEY_PREFIX}{name}, or set {KEY_PREFIX}mesh_backend {backend}",
                )
        backend_options = {name: value for name, value in extra.items() if backend_keys[name][0] == mesh_backend}
        return cls(**values, provenance={**provenance, **extra_provenance}, backend_options=backend_options)

    def origin(self, name: str) -> str:
        """Where option ``name`` came from, in words for the startup log."""
        source = self.provenance.get(name, "default")
        if source == "set":
            return "set in --additional-config"
        if source == "env":
            env = next(f.metadata["env"] for f in self.options() if f.name == name)
            return f"from {env}"
        return "default"

    def summary(self) -> str:
        """One line per option (the chosen backend's own included): value and whether it was set
        or defaulted."""
        values = [(f.name, getattr(self, f.name)) for f in self.options()] + list(self.backend_options.items())
        return ", ".join(f"{name}={value!r} ({self.provenance.get(name, 'default')})" for name, value in values)


def _read(known: Mapping[str, Any], tt: Mapping[str, Any],
          environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The values of the fields ``known`` that ``tt`` or the environment sets, and where each
    field's value came from."""
    values: dict[str, Any] = {}
    provenance: dict[str, str] = {}
    for name, f in known.items():
        env = f.metadata["env"]
        if name in tt:
            values[name] = _parse(f, tt[name], f"{KEY_PREFIX}{name}")
            provenance[name] = "set"
        elif env and environ.get(env):
            values[name] = _parse(f, environ[env], env)
            provenance[name] = "env"
        else:
            provenance[name] = "default"
    return values, provenance


def _parse(f: Any, raw: Any, setting: str) -> Any:
    kind = str(f.type)
    optional = "None" in kind
    if raw is None and optional:
        return None
    if kind.startswith("bool"):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return raw.strip().lower() in ("true", "1", "yes", "on")
        raise TTConfigError(setting, raw, "true or false", f"pass {setting} true or false")
    if kind.startswith("float"):
        value = raw
        if isinstance(raw, str):
            try:
                value = float(raw)
            except ValueError:
                value = raw
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TTConfigError(setting, raw, "a number", f"pass {setting} as a number")
        minimum = f.metadata["minimum"]
        if minimum is not None and value < minimum:
            raise TTConfigError(setting, raw, f"a number >= {minimum}", f"raise {setting} to at least {minimum}")
        return float(value)
    if kind.startswith("int"):
        value = raw
        if isinstance(raw, str) and raw.strip().isdigit():
            value = int(raw)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TTConfigError(setting, raw, "an integer", f"pass {setting} as a whole number")
        minimum = f.metadata["minimum"]
        if minimum is not None and value < minimum:
            raise TTConfigError(setting, raw, f"an integer >= {minimum}", f"raise {setting} to at least {minimum}")
        return value
    if not isinstance(raw, str):
        raise TTConfigError(setting, raw, "a string", f"pass {setting} as text")
    check = f.metadata["check"]
    if check is not None:
        try:
            check(raw)
        except ValueError as exc:
            raise TTConfigError(setting, raw, f.metadata["allowed"], str(exc)) from None
    choices = f.metadata["choices"] or (f.metadata["choices_from"]() if f.metadata["choices_from"] else ())
    if choices and raw not in choices:
        close = difflib.get_close_matches(raw, list(choices), n=1)
        fix = f"use {close[0]!r}" if close else f"use one of {', '.join(choices)}"
        raise TTConfigError(setting, raw, f"one of {', '.join(choices)}", fix)
    return raw


def markdown_reference() -> str:
    """The configuration reference page, generated from the fields above."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from vllm_tt_platform/config/options.py by `python scripts/gen_docs.py`; do not edit. -->",
        "",
        "Pass options as `--additional-config.tt.<key> <value>` (or "
        "`--additional-config '{\"tt\": {...}}'`, or `additional_config={\"tt\": {...}}` in "
        "`vllm.LLM`). Unknown keys, wrong types and values outside the allowed set are errors.",
        "",
        "| key | type | default | allowed | env | description |",
        "|---|---|---|---|---|---|",
    ]
    backend_fields = [f for table in option_tables().values() for f in fields(table)]
    for f in [*TTConfig.options(), *backend_fields]:
        default = f.default if f.default is not MISSING else ""
        choices = f.metadata["choices"]
        allowed = ", ".join(f"`{c}`" for c in choices) if choices else f.metadata["allowed"] or (
            "`ttnn` member names" if f.metadata["choices_from"] else (
                f">= {f.metadata['minimum']}" if f.metadata["minimum"] is not None else ""))
        env = f"`{f.metadata['env']}`" if f.metadata["env"] else ""
        kind = str(f.type).replace(" | None", ", optional")
        lines.append(f"| `{f.name}` | {kind} | `{default!r}` | {allowed} | {env} | {f.metadata['doc']} |")
    lines += ["", "## Environment variables", "",
              "Besides the `env` column above, the platform reads these (the model registry's own "
              "variables are in [Model bundles](bundles.md)):", "", envs.markdown_table()]
    return "\n".join(lines)

