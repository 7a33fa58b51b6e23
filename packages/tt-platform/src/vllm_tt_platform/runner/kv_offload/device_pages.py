"""``DevicePages``: one lane's KV cache, as KV cache groups of blocks that can be copied to
and from host memory through the model contract (``read_kv_blocks`` / ``write_kv_blocks``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_tt_platform.runner.kv_layout import KVLayout

LayerPages = list[torch.Tensor]
"""One layer's blocks on the host: each of its distinct cache tensors, indexed by block."""


@dataclass(frozen=True)
class DevicePages:
    model: Any
    kv_cache: Any
    layout: KVLayout
    lane: int = 0

    def layers_of(self, group: int) -> tuple[int, ...]:
        """The layers of vLLM's KV cache group ``group`` that own their storage (a layer that
        reads another layer's KV has no blocks of its own to copy)."""
        return tuple(layer for layer in self.layout.groups[group].layers if layer not in self.layout.shared)

    def storage_of(self, layer: int) -> int:
        """The storage slot of ``layer`` (layers of overlaid groups share one)."""
        return self.layout.layers[layer].tensor_idx

    def read(self, group: int, block_ids: Sequence[int]) -> Any:
        """Start the copy of ``block_ids`` of ``group`` to the host; a handle whose ``result()``
        is one ``LayerPages`` per layer of ``layers_of(group)``."""
        return self.model.read_kv_blocks(kv_cache=self.kv_cache, lane=self.lane, layers=list(self.layers_of(group)),
                                         block_ids=torch.as_tensor(block_ids, dtype=torch.long))

    def write(self, group: int, block_ids: Sequence[int], pages: Sequence[LayerPages]) -> Any:
        """Start the copy of ``pages`` (one per layer of ``layers_of(group)``) into ``block_ids``."""
        return self.model.write_kv_blocks(kv_cache=self.kv_cache, lane=self.lane, layers=list(self.layers_of(group)),
                                          block_ids=torch.as_tensor(block_ids, dtype=torch.long), pages=list(pages))
