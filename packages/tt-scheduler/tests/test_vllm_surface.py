"""``vllm_surface.VLLM_SURFACE`` against the installed vLLM: every name the scheduler reads or
writes exists on the real class (or on an instance vLLM builds, for names set in ``__init__``).

A vLLM release that renames one fails here, naming ``Class.attribute``, instead of the scheduler
silently writing an attribute vLLM no longer reads.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections import Counter
from typing import Any

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_tt_scheduler.vllm_surface import VLLM_SURFACE, Touch
from vllm_tt_testing.scheduler_sim import SimConfig, build_scheduler, make_request


def problems(touch: Touch, instance: object | None = None) -> list[str]:
    """The names of ``touch`` the installed vLLM lacks (not a dataclass field, not on the class,
    not on ``instance``), and the keywords of its calls no signature takes."""
    module_name, _, class_name = touch.owner.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if cls is None:
        return [f"{touch.owner}: no such class"]
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()

    def found(name: str) -> bool:
        return name in fields or hasattr(cls, name) or (instance is not None and hasattr(instance, name))

    missing = [f"{class_name}.{name}" for name in touch.names if not found(name)]
    for method, keywords in touch.calls:
        if found(method):
            parameters = inspect.signature(getattr(cls, method)).parameters
            missing += [f"{class_name}.{method}({kw}=)" for kw in keywords if kw not in parameters]
    return missing


@pytest.fixture(scope="module")
def instances() -> dict[str, Any]:
    """vLLM's own objects whose attributes are set in ``__init__``, built as the engine does."""
    from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager

    sched = build_scheduler(Scheduler, SimConfig())
    manager = sched.kv_cache_manager
    return {
        "Scheduler": sched,
        "Request": make_request("a", 8, 4),
        "KVCacheManager": manager,
        "BlockPool": manager.block_pool,
        "EncoderCacheManager": sched.encoder_cache_manager,
        "EncoderDecoderCacheManager": EncoderDecoderCacheManager(cache_size=64),
    }


@pytest.mark.parametrize("touch", VLLM_SURFACE, ids=lambda t: t.owner.partition(":")[2])
def test_every_name_exists_in_installed_vllm(touch: Touch, instances: dict[str, Any]) -> None:
    assert problems(touch, instances.get(touch.owner.partition(":")[2])) == []


def test_instance_attributes_are_checked_on_an_instance(instances: dict[str, Any]) -> None:
    # Set in Scheduler.__init__ (not on the class): only the instance has it.
    assert not hasattr(Scheduler, "prev_step_scheduled_req_ids")
    touch = Touch("vllm.v1.core.sched.scheduler:Scheduler", reads=("prev_step_scheduled_req_ids",))
    assert problems(touch, instances["Scheduler"]) == []
    assert problems(touch) == ["Scheduler.prev_step_scheduled_req_ids"]


def test_a_renamed_attribute_or_class_is_named(instances: dict[str, Any]) -> None:
    renamed = Touch("vllm.v1.request:Request", reads=("num_computed_tokens", "num_tokenz"),
                    writes=("statuss",))
    assert problems(renamed, instances["Request"]) == ["Request.num_tokenz", "Request.statuss"]
    field = Touch("vllm.v1.core.sched.output:SchedulerOutput", reads=(), writes=("finished_req_idz",))
    assert problems(field) == ["SchedulerOutput.finished_req_idz"]
    keyword = Touch("vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator", reads=(),
                    calls=(("get_num_blocks_to_allocate", ("num_tokens", "num_tokenz")),))
    assert problems(keyword) == ["KVCacheCoordinator.get_num_blocks_to_allocate(num_tokenz=)"]
    gone = Touch("vllm.v1.request:Requestz", reads=("status",))
    assert problems(gone) == ["vllm.v1.request:Requestz: no such class"]


def test_each_class_and_name_is_listed_once() -> None:
    owners = Counter(touch.owner for touch in VLLM_SURFACE)
    assert [owner for owner, n in owners.items() if n > 1] == []
    for touch in VLLM_SURFACE:
        names = Counter(touch.names)
        assert [name for name, n in names.items() if n > 1] == [], touch.owner


def test_pending_encoder_frees_are_read_from_both_cache_managers():
    """An encoder-decoder model's cache manager has no ``freed``: its two-step buffer says
    whether the next hand-over moves entries (a lane with such entries is not idle)."""
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, EncoderDecoderCacheManager
    from vllm_tt_scheduler.scheduler import encoder_frees_pending

    enc_dec = EncoderDecoderCacheManager(cache_size=64)
    steps = []
    enc_dec.allocated.append("image")
    for _ in range(3):
        steps.append(encoder_frees_pending(enc_dec))
        enc_dec.get_freed_mm_hashes()
    assert steps == [True, True, False]
    cache = EncoderCacheManager(cache_size=64)
    assert not encoder_frees_pending(cache)
    cache.freed.append("image")
    assert encoder_frees_pending(cache)
