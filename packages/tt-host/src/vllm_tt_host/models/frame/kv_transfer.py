"""KV blocks between the emulated mesh and host memory (the contract's ``read_kv_blocks`` /
``write_kv_blocks``, ``supports_kv_transfer``).

Every KV kind the host models hold is a set of tensors indexed by block id first: ``[K, V]``
for full and sliding-window attention, one tensor held twice for latent attention (MLA), the
states of a recurrent layer (``BlockStates``). A copy is a program on the mesh's command queue,
so it runs in order with the forwards queued before it and, with modelled device time, takes
the host link's time for its bytes (``ProgramCosts.kv_transfer_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from vllm_tt_host.command_queue import DeviceFuture
from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.shapes import HostModelInputError

LayerPages = list[torch.Tensor]
"""One layer's blocks on the host: each of its distinct cache tensors at the blocks read."""


@runtime_checkable
class BlockStates(Protocol):
    """A layer cache that is not ``[K, V]``: it names its block-indexed tensors."""

    def tensors(self) -> tuple[torch.Tensor, ...]: ...


def layer_tensors(layer_kv: Any) -> list[torch.Tensor]:
    """The distinct tensors of one layer's cache (a latent layer's one tensor once)."""
    if isinstance(layer_kv, BlockStates):
        return list(layer_kv.tensors())
    distinct: list[torch.Tensor] = []
    for tensor in layer_kv:
        if not any(tensor is seen for seen in distinct):
            distinct.append(tensor)
    return distinct


class KVBlockCopies:
    """The two contract members over ``kv[lane][layer]`` caches; mixed into ``HostCausalLM``
    (which provides ``lanes``, ``queue``, ``costs`` and ``config``)."""

    lanes: Any
    queue: Any
    costs: Any
    config: Any

    def read_kv_blocks(self, kv_cache: Any, lane: int, layers: Sequence[int], block_ids: Any) -> DeviceFuture:
        ids, lane_kv = self._checked(kv_cache, lane, layers, block_ids)

        def program() -> list[LayerPages]:
            return [[tensor[ids].clone() for tensor in layer_tensors(lane_kv[layer])] for layer in layers]

        return self.queue.submit(program, self._copy_s(lane_kv, layers, len(ids)))

    def write_kv_blocks(self, kv_cache: Any, lane: int, layers: Sequence[int], block_ids: Any,
                        pages: Sequence[LayerPages]) -> DeviceFuture:
        ids, lane_kv = self._checked(kv_cache, lane, layers, block_ids)
        if len(pages) != len(layers):
            raise HostModelInputError(f"write_kv_blocks got pages of {len(pages)} layers for {len(layers)} layers")
        targets = [layer_tensors(lane_kv[layer]) for layer in layers]
        for layer, tensors, layer_pages in zip(layers, targets, pages, strict=True):
            shapes = [(len(ids), *t.shape[1:]) for t in tensors]
            given = [tuple(p.shape) for p in layer_pages]
            if given != shapes:
                raise HostModelInputError(
                    f"write_kv_blocks: layer {layer} takes pages of shapes {shapes} for {len(ids)} blocks, got {given}"
                )

        def program() -> None:
            for tensors, layer_pages in zip(targets, pages, strict=True):
                for tensor, page in zip(tensors, layer_pages, strict=True):
                    tensor[ids] = page.to(tensor.dtype)

        return self.queue.submit(program, self._copy_s(lane_kv, layers, len(ids)))

    def _checked(self, kv_cache: Any, lane: int, layers: Sequence[int],
                 block_ids: Any) -> tuple[torch.Tensor, Any]:
        if not 0 <= lane < self.lanes.count or len(kv_cache) != self.lanes.count:
            raise HostModelInputError(f"lane {lane} is not one of the KV cache's {self.lanes.count} lane(s)")
        lane_kv = kv_cache[lane]
        bad = [layer for layer in layers if not 0 <= layer < len(lane_kv)]
        if bad:
            raise HostModelInputError(f"layers {bad} are not in the KV cache (layers 0..{len(lane_kv) - 1})")
        ids = torch.as_tensor(block_ids, dtype=torch.long).reshape(-1)
        blocks = paged_kv.num_blocks(lane_kv) if len(ids) else 0
        outside = ids[(ids < 0) | (ids >= blocks)]
        if len(outside):
            raise HostModelInputError(f"block ids {outside.tolist()} are outside the lane's {blocks} blocks")
        return ids, lane_kv

    def _copy_s(self, lane_kv: Any, layers: Sequence[int], num_blocks: int) -> float:
        """The link time of ``num_blocks`` blocks of ``layers``: the tokens they hold, as a
        share of the model's layers (a recurrent layer's block counts as a block of tokens)."""
        if self.costs is None or not num_blocks:
            return 0.0
        tokens = num_blocks * paged_kv.block_size(lane_kv) * len(layers) / self.config.num_layers
        return self.costs.kv_transfer_s(tokens)
