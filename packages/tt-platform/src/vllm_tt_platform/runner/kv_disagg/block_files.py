"""``BlockFiles``: a prompt's KV blocks as files, one safetensors file per layer
(``<layer name>.safetensors``, the naming of vLLM's ``ExampleConnector``) in the folder that
connector names after the prompt's tokens.

A folder appears whole: it is written under a temporary name and renamed into place, so an
engine that finds it (vLLM's scheduler side checks only that it exists) finds every layer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from safetensors.torch import load_file, save_file

from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages, LayerPages

GROUP = 0
"""``ExampleConnector`` carries the blocks of the first KV cache group (vLLM turns the hybrid
manager off for it, so full and sliding-window layers share that group)."""


class BlockFiles:
    def __init__(self, pages: DevicePages, layer_names: Mapping[int, str]) -> None:
        self.pages = pages
        self.layer_names = layer_names
        """vLLM's KV cache layer name of each layer index of the group."""

    def save(self, folder: str, block_ids: Sequence[int]) -> int:
        """Copy ``block_ids`` to the host (queued behind the forward that computed them) and
        write them as ``folder``; the bytes written, 0 when the folder already exists (another
        engine, or an earlier request, stored the same prompt)."""
        if os.path.exists(folder) or not block_ids:
            return 0
        layer_pages: list[LayerPages] = self.pages.read(GROUP, block_ids).result()
        parent = os.path.dirname(folder) or "."
        os.makedirs(parent, exist_ok=True)
        partial = tempfile.mkdtemp(dir=parent, prefix=".partial-")
        nbytes = 0
        for layer, tensors in zip(self.pages.layers_of(GROUP), layer_pages, strict=True):
            save_file({f"kv_cache.{i}": t.contiguous() for i, t in enumerate(tensors)}, self._file(partial, layer))
            nbytes += sum(t.numel() * t.element_size() for t in tensors)
        try:
            os.rename(partial, folder)
        except OSError:  # stored meanwhile by another engine: keep theirs
            shutil.rmtree(partial, ignore_errors=True)
            return 0
        return nbytes

    def load(self, folder: str, block_ids: Sequence[int]) -> Any | None:
        """Queue the copy of ``folder``'s blocks into ``block_ids`` (ahead of the forward that
        reads them); the device handle, or None when the folder does not hold this model's
        layers for that many blocks (vLLM then fails the request: ``kv_load_failure_policy``)."""
        files = [self._file(folder, layer) for layer in self.pages.layers_of(GROUP)]
        if not block_ids or not all(os.path.exists(f) for f in files):
            return None
        pages = []
        for path in files:
            stored = load_file(path)
            tensors = [stored[f"kv_cache.{i}"] for i in range(len(stored))]
            if any(t.shape[0] != len(block_ids) for t in tensors):
                return None
            pages.append(tensors)
        return self.pages.write(GROUP, block_ids, pages)

    def _file(self, folder: str, layer: int) -> str:
        return os.path.join(folder, f"{self.layer_names[layer]}.safetensors")
