"""``BlockCopyModel``: the model contract's two KV block copies (``read_kv_blocks`` /
``write_kv_blocks``) over plain ``kv[lane][layer] = [K, V]`` tensors, for tests of what the
platform builds on them (KV offload, the shared-storage connector) without a model."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class BlockCopyModel:
    """The contract's two copy members over ``kv[0][layer] = [K, V]``; each copy completes when
    the test says (``release``), as a device copy completes when the device gets to it."""

    def __init__(self, manual: bool = False) -> None:
        self.manual = manual
        self.pending: list[tuple[Future, Callable[[], Any]]] = []

    def _submit(self, work):
        future: Future = Future()
        if self.manual:
            self.pending.append((future, work))
        else:
            future.set_result(work())
        return future

    def release(self) -> None:
        for future, work in self.pending:
            future.set_result(work())
        self.pending.clear()

    def read_kv_blocks(self, kv_cache, lane, layers, block_ids):
        return self._submit(lambda: [[t[block_ids].clone() for t in kv_cache[lane][layer]] for layer in layers])

    def write_kv_blocks(self, kv_cache, lane, layers, block_ids, pages):
        def work() -> None:
            for layer, tensors in zip(layers, pages, strict=True):
                for target, page in zip(kv_cache[lane][layer], tensors, strict=True):
                    target[block_ids] = page

        return self._submit(work)
