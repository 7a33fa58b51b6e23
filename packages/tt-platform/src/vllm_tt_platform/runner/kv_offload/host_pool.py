"""``HostPool``: the KV blocks offloaded to host memory, one row per host block.

vLLM's CPU manager hands out chunk ids (``blocks_per_chunk`` device blocks each); host block
``chunk * blocks_per_chunk + j`` is row ``j`` of chunk ``chunk``. Rows are kept per storage
slot and tensor, as the device keeps them: layers of groups vLLM overlays share a slot, and a
chunk id belongs to one group at a time, so they share rows too. A slot's tensors are
allocated on first use, sized for every chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages, LayerPages


class HostPool:
    def __init__(self, num_chunks: int, blocks_per_chunk: int) -> None:
        self.num_rows = num_chunks * blocks_per_chunk
        self.blocks_per_chunk = blocks_per_chunk
        self._rows: dict[tuple[int, int, int], torch.Tensor] = {}
        """``(storage slot, tensor position, values per block)`` -> ``[num_rows, values]``."""
        self._block_shapes: dict[tuple[int, int], tuple[torch.Size, torch.dtype]] = {}
        """``(layer, tensor position)`` -> one block's shape and dtype, as the device holds it."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._rows.values())

    def rows(self, chunk_ids: np.ndarray, first: int, count: int) -> np.ndarray:
        """Host rows of ``count`` consecutive blocks starting ``first`` blocks into ``chunk_ids``."""
        per = self.blocks_per_chunk
        rows = (chunk_ids.astype(np.int64)[:, None] * per + np.arange(per)).reshape(-1)
        return rows[first : first + count]

    def put(self, pages: DevicePages, group: int, rows: np.ndarray, layer_pages: Sequence[LayerPages]) -> None:
        index = torch.as_tensor(rows, dtype=torch.long)
        for layer, tensors in zip(pages.layers_of(group), layer_pages, strict=True):
            for position, tensor in enumerate(tensors):
                self._block_shapes[layer, position] = (tensor.shape[1:], tensor.dtype)
                flat = tensor.reshape(tensor.shape[0], -1)
                self._slot(pages.storage_of(layer), position, flat)[index] = flat

    def take(self, pages: DevicePages, group: int, rows: np.ndarray) -> list[LayerPages]:
        index = torch.as_tensor(rows, dtype=torch.long)
        taken = []
        for layer in pages.layers_of(group):
            tensors = []
            position = 0
            while (layer, position) in self._block_shapes:
                shape, _dtype = self._block_shapes[layer, position]
                values = int(np.prod(shape))
                slot = self._rows[pages.storage_of(layer), position, values]
                tensors.append(slot[index].reshape(len(rows), *shape))
                position += 1
            if not tensors:
                raise RuntimeError(f"host KV pool: layer {layer} was never offloaded, yet a load of it was asked for")
            taken.append(tensors)
        return taken

    def _slot(self, storage: int, position: int, flat: torch.Tensor) -> torch.Tensor:
        key = (storage, position, flat.shape[1])
        slot = self._rows.get(key)
        if slot is None:
            slot = self._rows[key] = torch.zeros(self.num_rows, flat.shape[1], dtype=flat.dtype)
        return slot
