"""``ExampleConnector``: vLLM's shared-storage connector with the TT worker side.

The scheduler side is vLLM's, unchanged: a new prompt with no stored folder is stored, one
with a folder is loaded (all its full blocks but the last token's), and the request's block
ids come in the connector metadata. vLLM's worker side copies token slots layer by layer from
inside the attention layers of a GPU forward; the TT model has no such layers, and its KV cache
lives on the mesh, so here whole blocks move through ``BlockFiles``: loads are queued before
the step's forward (vLLM starts synchronous loads first), stores at the end of the step
(``wait_for_save``), behind the forward that computed them. Only an engine whose role produces
KV (``kv_producer``, ``kv_both``) stores. The platform selects this class by name
(``config.kv_transfer.CONNECTOR_MODULES``).
"""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector as VLLMExampleConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata, ReqMeta
from vllm.forward_context import ForwardContext
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import KVCacheConfig

from vllm_tt_platform.runner.kv_disagg.block_files import GROUP, BlockFiles
from vllm_tt_platform.runner.kv_layout import layer_index
from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages

logger = init_logger("vllm." + __name__)


class ExampleConnector(VLLMExampleConnector):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._files: BlockFiles | None = None
        self._loading: list[tuple[list[int], Any]] = []
        """This step's loads: the blocks and their device handle."""
        self._failed: set[int] = set()
        self.blocks_stored = 0
        self.blocks_loaded = 0

    def attach(self, pages: DevicePages) -> None:
        """Bind the device KV cache (the runner does, once it is allocated)."""
        groups = [group.kind for group in pages.layout.groups]
        if len(groups) != 1:
            raise RuntimeError(f"ExampleConnector carries one KV cache group, the TT KV cache has {groups}; "
                               "the platform refuses models with recurrent or cross-attention KV at startup")
        names = {layer_index(name): name for name in self._kv_cache_config.kv_cache_groups[GROUP].layer_names}
        self._files = BlockFiles(pages, names)

    def describe(self) -> str:
        role = self._kv_transfer_config.kv_role
        return f"TT shared-storage KV ({role}) at {self._storage_path}: {self.files.pages.layout.describe()}"

    @property
    def files(self) -> BlockFiles:
        if self._files is None:
            raise RuntimeError("ExampleConnector has no device KV cache: the TT runner attaches it after allocation")
        return self._files

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        for request in self._requests(store=False):
            block_ids = _block_ids(request, self._block_size)
            handle = self.files.load(self._folder(request), block_ids)
            if handle is None:
                logger.warning("TT shared-storage KV: %d blocks not found in %s; reported as load errors",
                               len(block_ids), self._folder(request))
                self._failed.update(block_ids)
            else:
                self._loading.append((block_ids, handle))

    def wait_for_save(self) -> None:
        """End of the step: the loads have landed (a failed copy raises here), and the prompts
        first scheduled in this step are stored."""
        for block_ids, handle in self._loading:
            handle.result()
            self.blocks_loaded += len(block_ids)
        self._loading.clear()
        if not self._kv_transfer_config.is_kv_producer:
            return
        for request in self._requests(store=True):
            block_ids = _block_ids(request, self._block_size)
            if self.files.save(self._folder(request), block_ids):
                self.blocks_stored += len(block_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed = self._failed, set()
        return failed

    def _requests(self, *, store: bool) -> list[ReqMeta]:
        metadata = self._get_connector_metadata()
        if not isinstance(metadata, ExampleConnectorMetadata):
            raise TypeError(f"ExampleConnector got {type(metadata).__name__} from the scheduler")
        return [request for request in metadata.requests if request.is_store == store]

    def _folder(self, request: ReqMeta) -> str:
        return self._generate_foldername_debug(request.token_ids, request.mm_hashes)


def _block_ids(request: ReqMeta, block_size: int) -> list[int]:
    """The request's blocks: vLLM's metadata gives a slot per token of its whole blocks."""
    return (request.slot_mapping[::block_size] // block_size).tolist()
