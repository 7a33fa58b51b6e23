"""The environment variables the registry reads: one table, each with a parser and its meaning.

Variables are read lazily from a mapping passed in (``os.environ`` by default), so tests and
the platform can pass their own. ``docs/bundles.md`` documents the same table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from vllm_tt_models_registry.errors import RegistryError

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class EnvVar(Generic[T]):  # noqa: UP046 - requires-python >= 3.11 has no PEP 695
    """One environment variable: its name, default, parser and what it is for."""

    name: str
    default: str
    parse: Callable[[str, str], T]
    """``parse(name, raw)`` returns the value or raises :class:`RegistryError`."""
    doc: str
    allowed: tuple[str, ...] = ()
    """The accepted spellings when the variable is a choice (for docs and errors)."""

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        env = os.environ if environ is None else environ
        raw = env.get(self.name, "").strip()
        return self.parse(self.name, raw or self.default)


def _flag(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise RegistryError(
        f"{name}={raw!r} is not a boolean: expected one of {', '.join(_TRUE + _FALSE)}. "
        f"Fix: set {name}=0 to turn it off, or unset it"
    )


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw in allowed:
            return raw
        raise RegistryError(
            f"{name}={raw!r} is not supported: expected one of {', '.join(allowed)}. "
            f"Fix: set {name} to one of those, or unset it for {allowed[0]}"
        )

    return parse


def _optional_path(name: str, raw: str) -> Path | None:
    return Path(raw).expanduser() if raw else None


def _word(name: str, raw: str) -> str:
    return raw


EXTRA_MODELS_DIR: EnvVar[Path | None] = EnvVar(
    "EXTRA_MODELS_DIR",
    "",
    _optional_path,
    "A folder of model bundles: each subfolder holding vllm_metadata.json registers one TT "
    "architecture. Bundles win over builtin models of the same architecture.",
)
TT_VLLM_BUILTIN_MODELS: EnvVar[bool] = EnvVar(
    "TT_VLLM_BUILTIN_MODELS",
    "1",
    _flag,
    "0/false/no/off turns the builtin table (and the host backend's models) off: only bundles are served.",
    allowed=_TRUE + _FALSE,
)
_LLAMA_VARIANTS = ("tt_transformers", "llama3_70b_galaxy")
TT_LLAMA_TEXT_VER: EnvVar[str] = EnvVar(
    "TT_LLAMA_TEXT_VER",
    _LLAMA_VARIANTS[0],
    _choice(*_LLAMA_VARIANTS),
    "Which tt-metal implementation serves TTLlamaForCausalLM: the generic tt_transformers "
    "model, or the Galaxy Llama-3.3-70B model (one program over the mesh, in-process lanes).",
    allowed=_LLAMA_VARIANTS,
)
_QWEN3_VARIANTS = ("tt_transformers", "qwen3_32b_galaxy")
TT_QWEN3_TEXT_VER: EnvVar[str] = EnvVar(
    "TT_QWEN3_TEXT_VER",
    _QWEN3_VARIANTS[0],
    _choice(*_QWEN3_VARIANTS),
    "Which tt-metal implementation serves TTQwen3ForCausalLM: tt_transformers, or the Galaxy "
    "Qwen3-32B model (one program over the mesh, in-process lanes).",
    allowed=_QWEN3_VARIANTS,
)
TT_MESH_BACKEND: EnvVar[str] = EnvVar(
    "TT_MESH_BACKEND",
    "ttnn",
    _word,
    "The mesh backend the vLLM plugin registers models for: ttnn (tt-metal models) or the "
    "name of an installed model source such as host (the platform validates the value).",
)

ENV_VARS: tuple[EnvVar, ...] = (
    EXTRA_MODELS_DIR,
    TT_VLLM_BUILTIN_MODELS,
    TT_LLAMA_TEXT_VER,
    TT_QWEN3_TEXT_VER,
    TT_MESH_BACKEND,
)


def markdown_table() -> str:
    """The variables as a Markdown table; ``docs/bundles.md`` embeds it (a test keeps it current)."""
    rows = ["| variable | default | values | meaning |", "|---|---|---|---|"]
    for var in ENV_VARS:
        values = " / ".join(f"`{v}`" for v in var.allowed) if var.allowed else "—"
        default = f"`{var.default}`" if var.default else "unset"
        rows.append(f"| `{var.name}` | {default} | {values} | {var.doc} |")
    return "\n".join(rows)
