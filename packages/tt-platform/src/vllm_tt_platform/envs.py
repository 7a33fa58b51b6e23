"""The environment variables the platform reads: one table, each with a parser and its meaning.

Read lazily from a mapping passed in (``os.environ`` by default). The registry's own variables
(``TT_MESH_BACKEND``, ``EXTRA_MODELS_DIR``, ...) live in its table; options that also have a
``--additional-config.tt`` key are declared with the option (``config.options``); the host
backend's are in ``vllm_tt_host.envs``. The configuration reference lists this table
(``python scripts/gen_docs.py``).
"""

from __future__ import annotations

from vllm_tt_models_registry.envs import EnvVar

from vllm_tt_platform.errors import TTConfigError


def _text(name: str, raw: str) -> str:
    return raw


def _optional_path(name: str, raw: str) -> str | None:
    return raw or None


MESH_DEVICE: EnvVar[str] = EnvVar(
    "MESH_DEVICE",
    "",
    _text,
    "The mesh to serve on, instead of -tp/-pp: a preset (N150, N300, T3K, TG, P150, BH-Galaxy, ...) "
    "or a shape such as (1,8). Unset: one device.",
)
def _device_ids(name: str, raw: str) -> tuple[int, ...]:
    if not raw:
        return ()
    try:
        ids = tuple(int(part) for part in raw.split(","))
    except ValueError:
        ids = ()
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise TTConfigError(name, raw, "distinct device ids separated by commas, e.g. 0,1,2,3",
                            f"set {name} to the host's device ids, or unset it")
    return ids


TT_VISIBLE_DEVICES: EnvVar[tuple[int, ...]] = EnvVar(
    "TT_VISIBLE_DEVICES",
    "",
    _device_ids,
    "The host's Tenstorrent devices the mesh is made of (comma-separated ids); with several "
    "data-parallel ranks on one host, rank i opens the i-th equal run of them. Unset: 0..n-1.",
)
TT_SAMPLING_TRACE: EnvVar[str | None] = EnvVar(
    "TT_SAMPLING_TRACE",
    "",
    _optional_path,
    "Path of a JSON-lines sampling trace (one line per step: phase, device or host, and why). "
    "Unset: off, at no cost.",
)
VLLM_TT_METRICS: EnvVar[str | None] = EnvVar(
    "VLLM_TT_METRICS",
    "",
    _optional_path,
    "Set by the platform, not by users: the ZMQ base address the engine sends its TT metrics to "
    "(`vllm serve` without `--disable-log-stats`). Unset: TT metrics off, at no cost.",
)
VLLM_TARGET_DEVICE: EnvVar[str] = EnvVar(
    "VLLM_TARGET_DEVICE",
    "",
    _text,
    "vLLM's own platform override: must be unset (or `tt`) while the TT backend serves.",
)
VLLM_USE_V2_MODEL_RUNNER: EnvVar[str] = EnvVar(
    "VLLM_USE_V2_MODEL_RUNNER",
    "0",
    _text,
    "vLLM's V2 runner switch: must be unset or 0 (the TT runner implements the V1 interface).",
)

ENV_VARS: tuple[EnvVar, ...] = (
    MESH_DEVICE, TT_VISIBLE_DEVICES, TT_SAMPLING_TRACE, VLLM_TT_METRICS, VLLM_TARGET_DEVICE,
    VLLM_USE_V2_MODEL_RUNNER,
)


def markdown_table(variables: tuple[EnvVar, ...] = ENV_VARS) -> str:
    """The variables as a Markdown table, for the configuration reference (the host backend
    renders its own table through this too)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var in variables:
        default = f"`{var.default}`" if var.default else "unset"
        rows.append(f"| `{var.name}` | {default} | {var.doc} |")
    return "\n".join(rows) + "\n"
