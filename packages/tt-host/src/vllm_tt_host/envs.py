"""The environment variables the host backend reads (the platform's own are in
``vllm_tt_platform.envs``); the configuration reference lists this table too
(``python scripts/gen_docs.py``)."""

from __future__ import annotations

from vllm_tt_models_registry.envs import EnvVar
from vllm_tt_platform import envs


def _optional_text(name: str, raw: str) -> str | None:
    return raw or None


TT_HOST_FAULTS: EnvVar[str | None] = EnvVar(
    "TT_HOST_FAULTS",
    "",
    _optional_text,
    "Host backend, tests only: `module:factory` of a fault injector (`vllm_tt_platform.faults.Faults`) "
    "installed on the emulated device, e.g. `vllm_tt_testing.device_faults:from_env`. Unset: no faults.",
)

ENV_VARS: tuple[EnvVar, ...] = (TT_HOST_FAULTS,)



def markdown_table() -> str:
    """The variables as a Markdown table, for the configuration reference."""
    return envs.markdown_table(ENV_VARS)
