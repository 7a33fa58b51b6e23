"""``TTOffloadingSpec``: vLLM's CPU offloading spec with the TT transfer handler.

The scheduler side (``get_manager``: vLLM's CPU manager, its chunk accounting and eviction
policy) is vLLM's; only the worker differs, since vLLM's own moves bytes with CUDA streams
between torch tensors, while the TT KV cache lives on the mesh behind the model contract.
The platform selects it through vLLM's out-of-tree spec keys (``spec_name`` /
``spec_module_path`` in ``kv_connector_extra_config``; ``selection.select_spec``).
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from vllm_tt_platform.runner.kv_offload.worker import TTOffloadingWorker


class TTOffloadingSpec(CPUOffloadingSpec):
    _tt_worker: TTOffloadingWorker | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """The TT worker, once per process (the runner attaches the device KV cache to it);
        ``kv_caches`` (vLLM's byte views of GPU tensors) has nothing to copy on TT."""
        if self._tt_worker is None:
            self._tt_worker = TTOffloadingWorker(
                [group.group_id for group in self.config.groups], self.num_chunks, self.blocks_per_chunk,
            )
        return self._tt_worker
