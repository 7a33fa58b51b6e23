"""``TTOffloadingWorker``: vLLM's offloading transfer handler for the mesh.

vLLM's connector worker submits a store (device blocks -> host chunks) or a load (host chunks
-> device blocks) per job and polls for finished jobs each step. Here a job is one
``read_kv_blocks`` / ``write_kv_blocks`` per KV cache group, queued on the device behind the
programs already submitted (so a store sees the KV of the forward that computed it, and a load
lands before the next forward); a store's pages enter the host pool once its copies completed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages
from vllm_tt_platform.runner.kv_offload.host_pool import HostPool

logger = init_logger("vllm." + __name__)


@dataclass(frozen=True)
class GroupCopy:
    """One KV cache group's part of a job: device blocks and the host rows they map to."""

    group: int
    """vLLM's KV cache group index."""
    block_ids: np.ndarray
    rows: np.ndarray


@dataclass
class _Job:
    job_id: int
    store: bool
    copies: list[tuple[GroupCopy, Any]]
    """Each group's copy with its device handle."""
    nbytes: int = 0
    started: float = field(default_factory=time.perf_counter)

    def done(self) -> bool:
        return all(handle.done() for _, handle in self.copies)


class TTOffloadingWorker(OffloadingWorker):
    def __init__(self, group_ids: Sequence[int], num_chunks: int, blocks_per_chunk: int) -> None:
        self.group_ids = tuple(group_ids)
        """vLLM group index of each offloaded group, in the order of a spec's ``group_sizes``."""
        self.pool = HostPool(num_chunks, blocks_per_chunk)
        self._pages: DevicePages | None = None
        self._jobs: dict[int, _Job] = {}
        self.blocks_stored = 0
        self.blocks_loaded = 0

    def attach(self, pages: DevicePages) -> None:
        """Bind the device KV cache (the runner does, once it is allocated)."""
        self._pages = pages

    def describe(self) -> str:
        per = self.pool.blocks_per_chunk
        return (f"TT KV offloading: {self.pool.num_rows // per} host chunks of {per} blocks; "
                f"groups {list(self.group_ids)} offloaded")

    @property
    def pages(self) -> DevicePages:
        if self._pages is None:
            raise RuntimeError("TTOffloadingWorker has no device KV cache: the TT runner attaches it after allocation")
        return self._pages

    def plan(self, device: GPULoadStoreSpec, host: LoadStoreSpec) -> list[GroupCopy]:
        """Split a job into group copies: group ``i``'s ``group_sizes[i]`` device blocks are
        logically consecutive from block ``block_indices[i]`` of the request, which sits
        ``block_indices[i] % blocks_per_chunk`` rows into that group's first host chunk."""
        if not isinstance(host, CPULoadStoreSpec):
            raise TypeError(f"TT KV offloading moves blocks to host memory, not {type(host).__name__}")
        per = self.pool.blocks_per_chunk
        copies = []
        block_at = chunk_at = 0
        for index, (size, first) in enumerate(zip(device.group_sizes, device.block_indices, strict=True)):
            if size == 0:
                continue
            skip = first % per
            chunks = cdiv(size + skip, per)
            rows = self.pool.rows(host.block_ids[chunk_at : chunk_at + chunks], skip, size)
            copies.append(GroupCopy(self.group_ids[index], device.block_ids[block_at : block_at + size], rows))
            block_at += size
            chunk_at += chunks
        return copies

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        pages = self.pages
        copies = self.plan(src_spec, dst_spec)
        self._jobs[job_id] = _Job(job_id, True, [(c, pages.read(c.group, c.block_ids.tolist())) for c in copies])
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        pages = self.pages
        copies = self.plan(dst_spec, src_spec)
        handles = []
        nbytes = 0
        for copy in copies:
            layer_pages = self.pool.take(pages, copy.group, copy.rows)
            nbytes += sum(t.numel() * t.element_size() for tensors in layer_pages for t in tensors)
            handles.append((copy, pages.write(copy.group, copy.block_ids.tolist(), layer_pages)))
        self._jobs[job_id] = _Job(job_id, False, handles, nbytes)
        return True

    def get_finished(self) -> list[TransferResult]:
        finished = [job for job in self._jobs.values() if job.done()]
        return [self._finish(job) for job in finished]

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None:
                for _, handle in job.copies:
                    handle.result()

    def _finish(self, job: _Job) -> TransferResult:
        del self._jobs[job.job_id]
        blocks = 0
        for copy, handle in job.copies:
            result = handle.result()  # raises the device's error, if the copy failed
            blocks += len(copy.block_ids)
            if job.store:
                self.pool.put(self.pages, copy.group, copy.rows, result)
                job.nbytes += sum(t.numel() * t.element_size() for tensors in result for t in tensors)
        if job.store:
            self.blocks_stored += blocks
        else:
            self.blocks_loaded += blocks
        logger.debug("TT KV offload: %s job %d, %d blocks, %d bytes", "store" if job.store else "load",
                     job.job_id, blocks, job.nbytes)
        return TransferResult(job.job_id, True, job.nbytes, time.perf_counter() - job.started)

    def shutdown(self) -> None:
        self._jobs.clear()
