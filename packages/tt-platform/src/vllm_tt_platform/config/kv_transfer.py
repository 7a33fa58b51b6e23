"""Which KV connector an engine runs, and the TT transfer handler selected for it; read at
config time in every process, so nothing here imports vLLM's offloading code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig

SPEC_KEYS = {"spec_name": "TTOffloadingSpec", "spec_module_path": "vllm_tt_platform.runner.kv_offload.spec"}
"""What ``kv_connector_extra_config`` says to select this spec."""


def resolved_kv_transfer(vllm_config: VllmConfig) -> KVTransferConfig | None:
    """The KV connector config the engine will run with. vLLM turns ``--kv-offloading-size``
    into a connector after the platform's config hook in the front end (and before it in the
    engine core); its resolution is idempotent, so it is run here first."""
    vllm_config._post_init_kv_transfer_config()
    return vllm_config.kv_transfer_config


def select_spec(extra_config: dict[str, Any]) -> None:
    """Point vLLM's ``OffloadingConnector`` at this spec, unless the user chose another spec
    (which ``startup_checks.check_kv_transfer`` then refuses by name)."""
    if "spec_name" not in extra_config:
        extra_config.update(SPEC_KEYS)
