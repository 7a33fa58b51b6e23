"""Options read from ``--additional-config`` and the vLLM settings the scheduler needs."""

from __future__ import annotations

import pytest
from vllm_tt_scheduler import CONFIG_KEYS, DEFAULT_PREFILL_BURST, DEFAULT_PREFILL_HOLD, SchedulerOptions


def test_defaults() -> None:
    assert SchedulerOptions.from_additional_config(None) == SchedulerOptions(
        DEFAULT_PREFILL_BURST, DEFAULT_PREFILL_HOLD, None
    )
    assert set(CONFIG_KEYS) == {
        "prefill_burst", "prefill_hold", "block_tokens", "itl_slo_ms", "_prefill_trace_lens", "_step_cost",
        "_mixed_shapes",
    }


def test_values_are_read() -> None:
    options = SchedulerOptions.from_additional_config(
        {"tt": {"prefill_burst": 3, "prefill_hold": 0, "block_tokens": 4,
                "_prefill_trace_lens": [128, 1024, 512]}}
    )
    assert options == SchedulerOptions(3, 0.0, 1024, block_tokens=4)


@pytest.mark.parametrize(
    ("tt", "message"),
    [
        ({"prefill_burst": 0}, "tt.prefill_burst=0 is invalid"),
        ({"prefill_burst": True}, "tt.prefill_burst=True"),
        ({"prefill_burst": "2"}, "integer >= 1"),
        ({"prefill_hold": -1}, "tt.prefill_hold=-1 is invalid"),
        ({"prefill_hold": float("inf")}, "number >= 0"),
        ({"block_tokens": -1}, "tt.block_tokens=-1 is invalid"),
        ({"_prefill_trace_lens": "128"}, "list of positive ints"),
        ({"_prefill_trace_lens": [128, 0]}, "positive ints only"),
    ],
)
def test_bad_values_name_the_key(tt: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        SchedulerOptions.from_additional_config({"tt": tt})


def test_tt_section_must_be_a_mapping() -> None:
    with pytest.raises(ValueError, match="must be a mapping"):
        SchedulerOptions.from_additional_config({"tt": [1]})
    with pytest.raises(ValueError, match="additional_config must be a mapping, got tuple"):
        SchedulerOptions.from_additional_config(("tt",))


def _build(**config: object) -> object:
    from vllm_tt_scheduler import TTScheduler
    from vllm_tt_testing.scheduler_sim import SimConfig, build_scheduler

    return build_scheduler(TTScheduler, SimConfig(**config))  # type: ignore[arg-type]


def test_trace_cap_below_budget_sets_or_checks_vllm_chunk_threshold() -> None:
    scheduler = _build(tt={"_prefill_trace_lens": [16, 48]})
    assert scheduler.scheduler_config.long_prefill_token_threshold == 48  # unset: adopted
    scheduler = _build(long_prefill_token_threshold=32, tt={"_prefill_trace_lens": [48]})
    assert scheduler.scheduler_config.long_prefill_token_threshold == 32  # smaller: kept
    with pytest.raises(ValueError, match=r"long_prefill_token_threshold=60 exceeds .* \[1, 48\]"):
        _build(long_prefill_token_threshold=60, tt={"_prefill_trace_lens": [48]})
    scheduler = _build(tt={"_prefill_trace_lens": [64, 128]})  # no smaller than the budget (64)
    assert scheduler.scheduler_config.long_prefill_token_threshold == 0


def test_unsupported_vllm_features_are_refused() -> None:
    from vllm.config import KVTransferConfig
    from vllm_tt_scheduler.options import SchedulerOptions as Options
    from vllm_tt_scheduler.requirements import check_vllm_config
    from vllm_tt_testing.scheduler_sim import SimConfig, build_vllm_config

    vllm_config = build_vllm_config(SimConfig())
    vllm_config.kv_transfer_config = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")
    with pytest.raises(ValueError, match="KV connector NixlConnector is not supported"):
        check_vllm_config(vllm_config, Options(), 64)
    for served in ("OffloadingConnector", "ExampleConnector"):  # their per-pass metadata merges (carry.py)
        vllm_config.kv_transfer_config = KVTransferConfig(kv_connector=served, kv_role="kv_both")
        check_vllm_config(vllm_config, Options(), 64)


def test_a_discarded_pass_hands_its_kv_connector_jobs_on() -> None:
    """An empty prefill pass may plan a load (a request now waiting for it) or stores; the pass
    that runs instead carries them, or the request would wait for good."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        TransferJob,
    )
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm_tt_scheduler.carry import carry_over

    def output(meta: OffloadingConnectorMetadata) -> SchedulerOutput:
        out = SchedulerOutput.make_empty()
        out.kv_connector_metadata = meta
        return out

    load, store = TransferJob("a", None, None), TransferJob("b", None, None)  # type: ignore[arg-type]
    discarded = output(OffloadingConnectorMetadata(load_jobs={1: load}, store_jobs={}, jobs_to_flush={4}))
    kept = output(OffloadingConnectorMetadata(load_jobs={}, store_jobs={2: store}))
    merged = carry_over(discarded, kept).kv_connector_metadata
    assert isinstance(merged, OffloadingConnectorMetadata)
    assert (merged.load_jobs, merged.store_jobs, merged.jobs_to_flush) == ({1: load}, {2: store}, {4})


def test_a_discarded_pass_hands_its_shared_storage_requests_on() -> None:
    """The shared-storage connector's loads and stores of both passes reach the runner."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm_tt_scheduler.carry import carry_over

    def output(*stores: bool) -> SchedulerOutput:
        out = SchedulerOutput.make_empty()
        meta = ExampleConnectorMetadata()
        for store in stores:
            meta.add_request(token_ids=list(range(9)), block_ids=[3, 4], block_size=4, is_store=store, mm_hashes=[])
        out.kv_connector_metadata = meta
        return out

    merged = carry_over(output(False), output(True)).kv_connector_metadata
    assert isinstance(merged, ExampleConnectorMetadata)
    assert [r.is_store for r in merged.requests] == [False, True]
    assert torch.equal(merged.requests[0].slot_mapping, torch.arange(12, 20))


def test_speculative_decoding_is_accepted() -> None:
    """Verify steps are decode steps (issue 19): the scheduler no longer refuses drafts."""
    from types import SimpleNamespace

    from vllm_tt_scheduler.requirements import check_vllm_config

    check_vllm_config(SimpleNamespace(speculative_config=object()), SchedulerOptions(), 64)
