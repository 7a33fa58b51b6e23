"""``TTOffloadingWorker``: vLLM's offloading jobs (device blocks per KV cache group, host chunks of
``blocks_per_chunk`` blocks) turned into the contract's block copies and a host pool."""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout, LayerKV
from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages
from vllm_tt_platform.runner.kv_offload.worker import TTOffloadingWorker
from vllm_tt_testing.block_copies import BlockCopyModel

BLOCKS = 10
SHAPE = (BLOCKS, 2, 16, 4)


def _layout() -> KVLayout:
    """A full group (layers 0, 1) and a sliding group (layer 2) overlaid on layer 0's storage."""
    groups = (KVGroup(0, (0, 1), 16, None), KVGroup(1, (2,), 16, 32, 31))
    layers = (LayerKV(0, SHAPE, torch.float32, 0), LayerKV(0, SHAPE, torch.float32, 1),
              LayerKV(1, SHAPE, torch.float32, 0))
    return KVLayout(groups, layers)


def _cache(seed: int) -> list[list[list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    storage = [[torch.randn(SHAPE, generator=generator) for _ in range(2)] for _ in range(2)]
    return [[storage[0], storage[1], storage[0]]]  # layer 2 shares layer 0's storage, as vLLM overlays them


def _worker(model, kv) -> TTOffloadingWorker:
    worker = TTOffloadingWorker(group_ids=(0, 1), num_chunks=4, blocks_per_chunk=2)
    worker.attach(DevicePages(model, kv, _layout()))
    return worker


def test_a_stored_job_loads_back_into_other_blocks():
    """Group 0's blocks 5, 6, 7 are the request's blocks 1..3, so they start one row into host
    chunk 0; group 1's block 9 fills chunk 2. Loaded into blocks 1, 2, 3 and 4, each layer holds
    exactly what it stored, the overlaid layer included."""
    model = BlockCopyModel()
    source, target = _cache(1), _cache(2)
    host = CPULoadStoreSpec([0, 1, 2])
    store = _worker(model, source)
    copies = store.plan(GPULoadStoreSpec([5, 6, 7, 9], group_sizes=[3, 1], block_indices=[1, 0]), host)
    assert [(c.group, c.block_ids.tolist(), c.rows.tolist()) for c in copies] == [(0, [5, 6, 7], [1, 2, 3]),
                                                                                   (1, [9], [4])]
    assert store.submit_store(1, GPULoadStoreSpec([5, 6, 7, 9], [3, 1], [1, 0]), host)
    [stored] = store.get_finished()
    assert stored.job_id == 1 and stored.success and stored.transfer_size == (3 * 2 + 1) * 2 * (2 * 16 * 4) * 4  # (blocks x layers) x K, V x float32
    # A second worker over another cache shares the host pool of the first (one process, one pool).
    load = _worker(model, target)
    load.pool = store.pool
    assert load.submit_load(2, host, GPULoadStoreSpec([1, 2, 3, 4], [3, 1], [1, 0]))
    [loaded] = load.get_finished()
    assert loaded.job_id == 2 and (store.blocks_stored, load.blocks_loaded) == (4, 4)
    for layer, blocks, sources in ((0, [1, 2, 3], [5, 6, 7]), (1, [1, 2, 3], [5, 6, 7]), (2, [4], [9])):
        for got, want in zip(target[0][layer], source[0][layer], strict=True):
            assert torch.equal(got[blocks], want[sources]), f"layer {layer}"


def test_jobs_finish_when_the_device_copies_do():
    model = BlockCopyModel(manual=True)
    worker = _worker(model, _cache(3))
    worker.submit_store(7, GPULoadStoreSpec([1, 2], [2, 0], [0, 0]), CPULoadStoreSpec([3]))
    assert worker.get_finished() == []  # queued behind the device's programs
    model.release()
    assert [r.job_id for r in worker.get_finished()] == [7]
    assert worker.get_finished() == []


def test_host_rows_of_chunks():
    worker = TTOffloadingWorker(group_ids=(0,), num_chunks=8, blocks_per_chunk=4)
    assert worker.pool.rows(np.array([2, 5]), 3, 4).tolist() == [11, 20, 21, 22]
