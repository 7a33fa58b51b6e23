"""Carry what a discarded scheduling pass drained into the output that runs instead.

Every call to vLLM's ``schedule()`` hands over, and then forgets, the ids of requests
finished or preempted since the last call, the encoder cache entries freed, and a
few KV-manager queues. When a pass that scheduled nothing is replaced by the other
phase's pass, dropping those leaves stale requests (and their device state) on the
runner for good. A KV connector's metadata is drained the same way (the loads and stores
a pass planned, e.g. a load for a request that now waits for it): it is merged where its
type is known (``MERGEABLE_CONNECTORS``); the scheduler refuses other connectors.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingConnectorMetadata
from vllm.v1.core.sched.output import SchedulerOutput

from vllm_tt_scheduler.compat import encoder_input_updates


def carry_over(discarded: SchedulerOutput, kept: SchedulerOutput) -> SchedulerOutput:
    """Merge the drained fields of ``discarded`` into ``kept`` and return ``kept``."""
    if discarded.finished_req_ids:
        kept.finished_req_ids = discarded.finished_req_ids | kept.finished_req_ids
    if discarded.preempted_req_ids:
        kept.preempted_req_ids = discarded.preempted_req_ids | (kept.preempted_req_ids or set())
    if discarded.free_encoder_mm_hashes:
        kept.free_encoder_mm_hashes = discarded.free_encoder_mm_hashes + kept.free_encoder_mm_hashes
    discarded_updates = encoder_input_updates(discarded)
    if discarded_updates:
        merged = dict(discarded_updates)
        for req_id, updates in encoder_input_updates(kept).items():
            merged[req_id] = {**merged.get(req_id, {}), **updates}
        kept.encoder_input_updates = merged
    if discarded.new_block_ids_to_zero:
        kept.new_block_ids_to_zero = discarded.new_block_ids_to_zero + (kept.new_block_ids_to_zero or [])
    if discarded.kv_cache_block_copies:
        kept.kv_cache_block_copies = discarded.kv_cache_block_copies + (kept.kv_cache_block_copies or [])
    if discarded.kv_connector_metadata is not None:
        kept.kv_connector_metadata = _merged_connector_metadata(discarded.kv_connector_metadata,
                                                                kept.kv_connector_metadata)
    return kept


MERGEABLE_CONNECTORS: tuple[str, ...] = ("OffloadingConnector", "ExampleConnector")
"""vLLM KV connectors whose per-pass metadata ``carry_over`` merges."""


def _merged_connector_metadata(discarded: object, kept: object) -> KVConnectorMetadata:
    """The offloading connector's jobs of both passes (job ids are unique per scheduler), or
    the shared-storage connector's requests of both (each pass lists the requests it
    scheduled)."""
    if isinstance(discarded, OffloadingConnectorMetadata) and isinstance(kept, OffloadingConnectorMetadata):
        flush = (discarded.jobs_to_flush or set()) | (kept.jobs_to_flush or set())
        return OffloadingConnectorMetadata(
            load_jobs={**discarded.load_jobs, **kept.load_jobs},
            store_jobs={**discarded.store_jobs, **kept.store_jobs},
            jobs_to_flush=flush or None,
        )
    # Imported here: vLLM's example connector module pulls in its attention layers, which only
    # an engine running that connector (and so having imported them already) needs.
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata

    if isinstance(discarded, ExampleConnectorMetadata) and isinstance(kept, ExampleConnectorMetadata):
        return ExampleConnectorMetadata(requests=discarded.requests + kept.requests)
    raise TypeError(f"cannot merge KV connector metadata {type(discarded).__name__} into {type(kept).__name__}")
