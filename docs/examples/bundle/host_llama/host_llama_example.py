"""Example bundle adapter: serves Llama checkpoints through the host reference Llama model.

An adapter is any class that fulfils the TT model contract (``vllm_tt_models_registry.contract``).
This one is a thin subclass of the host backend's Llama, so it runs without a device
(``TT_MESH_BACKEND=host``); an adapter for hardware wraps a tt-metal generator class the same way.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_tt_host.models.families import HostLlamaForCausalLM

logger = logging.getLogger("vllm.host_llama_example")  # under "vllm." so vLLM prints it


class ExampleLlamaForCausalLM(HostLlamaForCausalLM):
    """The host Llama, announcing itself so the log shows the bundle (not the builtin) serves."""

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
        **kwargs: Any,
    ) -> ExampleLlamaForCausalLM:
        logger.info("example bundle: %s serves %s", cls.__name__, getattr(hf_config, "_name_or_path", "?"))
        return super().initialize_vllm_model(
            hf_config,
            mesh_device,
            max_batch_size,
            max_seq_len,
            tt_data_parallel=tt_data_parallel,
            optimizations=optimizations,
            **kwargs,
        )
