"""Which KV connector an engine runs, and the TT transfer handler selected for it; read at
config time in every process, so nothing here imports vLLM's connectors.

Two of vLLM's connectors are served, each with its scheduler side unchanged and a TT worker
side substituted the way vLLM lets an out-of-tree platform do it: ``OffloadingConnector``
(``--kv-offloading-size``) through its spec keys, ``ExampleConnector`` (the shared-storage
connector of vLLM's disaggregated prefill examples) through ``kv_connector_module_path``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig

SPEC_KEYS = {"spec_name": "TTOffloadingSpec", "spec_module_path": "vllm_tt_platform.runner.kv_offload.spec"}
"""What ``kv_connector_extra_config`` says to select this spec."""

OFFLOADING = "OffloadingConnector"
SHARED_STORAGE = "ExampleConnector"

CONNECTOR_MODULES = {SHARED_STORAGE: "vllm_tt_platform.runner.kv_disagg.connector"}
"""Connectors whose class the platform replaces by name: the module holding the TT subclass
(same class name, so vLLM's factory finds it through ``kv_connector_module_path``)."""

NOT_ROUND_TRIPPED_KINDS = ("recurrent_state", "cross_attention")
"""KV kinds ``ExampleConnector`` cannot carry: its scheduler side moves the blocks of the first
KV cache group only, and vLLM turns the hybrid manager off for it, which recurrent-state models
need; cross-attention blocks are the encoder's, in a group of their own."""


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


def select_connector_module(kv: KVTransferConfig) -> None:
    """Point vLLM's connector factory at the TT subclass of ``kv.kv_connector`` (idempotent)."""
    module = CONNECTOR_MODULES.get(kv.kv_connector or "")
    if module is not None:
        kv.kv_connector_module_path = module
