"""``vllm_tt_platform.compat``: its shims on the installed vLLM, and their tombstones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from vllm.v1.engine import utils as engine_utils
from vllm_tt_platform import compat

from tests.tombstone import Tombstone

DIST = "vllm-tt-platform"

FORK_AFTER_OPENMP = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(2)
    torch.ones(4_000_000).add_(1).sum()          # the parent runs an OpenMP parallel region
    if sys.argv[1] == "hook":
        from vllm_tt_platform.compat import release_openmp_before_fork
        release_openmp_before_fork()
    from vllm.utils.system_utils import get_mp_context

    def child():
        torch.zeros(4_000_000).add_(1).sum()     # deadlocks if the parent's workers were not joined

    process = get_mp_context().Process(target=child)    # how vLLM starts the engine core
    process.start()
    process.join(float(sys.argv[2]))
    print("CHILD_FINISHED" if process.exitcode == 0 else "CHILD_STUCK")
    if process.is_alive():
        process.kill()
    """
)


def _fork_after_openmp(mode: str, timeout: float) -> str:
    result = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_OPENMP, mode, str(timeout)],
        capture_output=True, text=True, timeout=timeout + 240,
        env={**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "fork"},
    )
    marks = [line for line in result.stdout.splitlines() if line.startswith("CHILD_")]
    assert marks, result.stderr[-3000:]
    return marks[-1]


def test_tombstone_release_openmp_before_fork():
    Tombstone("vllm_tt_platform.compat.release_openmp_before_fork", DIST, needed_through="0.32").check(
        needed_here=not compat.VLLM_RELEASES_OPENMP_BEFORE_FORK
    )


def test_forked_engine_core_can_use_openmp_with_the_hook():
    assert _fork_after_openmp("hook", timeout=120) == "CHILD_FINISHED"


def test_without_the_hook_a_fork_deadlocks_exactly_where_the_probe_says():
    # The evidence behind the probe: on releases that do not pause libgomp, the child hangs.
    expected = "CHILD_FINISHED" if compat.VLLM_RELEASES_OPENMP_BEFORE_FORK else "CHILD_STUCK"
    assert _fork_after_openmp("plain", timeout=30) == expected


def test_hook_is_registered_only_where_vllm_lacks_it():
    assert compat.release_openmp_before_fork() is (not compat.VLLM_RELEASES_OPENMP_BEFORE_FORK)


def test_libgomp_is_found_in_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /opt/torch/lib/libgomp-a34b3233.so.1\n"
        "7f01-7f02 r--p 00000000 08:01 1 /opt/torch/lib/libgomp-a34b3233.so.1\n"
        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n"
        "7f03-7f04 r-xp 00000000 08:01 2 /usr/lib/libc.so.6\n"
    )
    assert compat.loaded_libgomp_paths(maps) == ["/opt/torch/lib/libgomp-a34b3233.so.1"]
    assert compat.loaded_libgomp_paths(tmp_path / "absent") == []


WINDOW_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"


@pytest.fixture
def no_window_env(monkeypatch):
    """The cleanup-window variable unset, and unset again after the test."""
    monkeypatch.setenv(WINDOW_ENV, "0")
    monkeypatch.delenv(WINDOW_ENV)


def test_tombstone_grant_engine_cleanup_window(no_window_env):
    # Needed while vLLM gives an OOT platform no teardown window of its own after an abort-mode
    # SIGTERM: asked nothing, the process manager kills the EngineCore at once (0 s).
    Tombstone("vllm_tt_platform.compat.grant_engine_cleanup_window", DIST).check(
        needed_here=engine_utils.get_engine_process_shutdown_timeout(0, 0) == 0
    )


def test_abort_mode_gets_a_cleanup_window_where_vllm_can_give_one(no_window_env):
    granted = compat.grant_engine_cleanup_window(SimpleNamespace(shutdown_timeout=0))
    assert granted is compat.VLLM_GRANTS_CLEANUP_WINDOW_ON_REQUEST
    expected = compat.ENGINE_CLEANUP_WINDOW_S if granted else 0
    assert engine_utils.get_engine_process_shutdown_timeout(0, 0) == expected


def test_a_cleanup_window_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv(WINDOW_ENV, "17")
    compat.grant_engine_cleanup_window(SimpleNamespace(shutdown_timeout=0))
    assert os.environ[WINDOW_ENV] == "17"


def test_drain_mode_needs_no_window(no_window_env):
    assert compat.grant_engine_cleanup_window(SimpleNamespace(shutdown_timeout=30)) is False
    assert WINDOW_ENV not in os.environ


def test_without_the_vllm_knob_the_limitation_is_announced(monkeypatch, no_window_env):
    monkeypatch.setattr(compat, "VLLM_GRANTS_CLEANUP_WINDOW_ON_REQUEST", False)
    warnings: list[str] = []
    monkeypatch.setattr(compat.logger, "warning_once", lambda msg, *a, **k: warnings.append(msg % a))
    assert compat.grant_engine_cleanup_window(SimpleNamespace(shutdown_timeout=0)) is False
    assert WINDOW_ENV not in os.environ
    assert len(warnings) == 1 and "--shutdown-timeout N" in warnings[0]


def test_tombstone_kv_cache_groups():
    # vLLM 0.31 / 0.32 group KV cache specs in kv_cache_utils; 0.33 moved it to kv_cache_planning.
    Tombstone("vllm_tt_platform.compat.HAS_KV_CACHE_PLANNING", DIST,
              needed_through="0.32").check(needed_here=not compat.HAS_KV_CACHE_PLANNING)


def test_kv_cache_groups_are_vllms_grouping_of_a_copy():
    import torch
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    from vllm_tt_testing.scheduler_sim import SimConfig, build_vllm_config

    common = {"block_size": 16, "num_kv_heads": 2, "head_size": 16, "dtype": torch.float32}
    spec = {f"model.layers.{i}.self_attn": SlidingWindowSpec(**common, sliding_window=20) if i % 2 == 0
            else FullAttentionSpec(**common) for i in range(4)}
    vllm_config = build_vllm_config(SimConfig())
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True  # vLLM then rewrites the specs
    resolve_kv_cache_layout(vllm_config, [["LBHNC"]], list(spec.values()))
    given = dict(spec)
    (group,) = compat.kv_cache_groups(vllm_config, spec)
    assert len(group.layer_names) == 4 and spec == given
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
    groups = compat.kv_cache_groups(vllm_config, spec)
    assert [(type(g.kv_cache_spec).__name__, g.layer_names) for g in groups] == [
        ("SlidingWindowSpec", ["model.layers.0.self_attn", "model.layers.2.self_attn"]),
        ("FullAttentionSpec", ["model.layers.1.self_attn", "model.layers.3.self_attn"]),
    ]


def test_tombstone_tt_metrics_side_channel():
    """The TT metrics' own ZMQ socket stands in for a platform field in vLLM's SchedulerStats."""
    Tombstone("vllm_tt_platform.metrics (engine -> API server ZMQ channel)", DIST).check(
        needed_here=not compat.VLLM_STATS_CARRY_PLATFORM_STATS
    )


def test_vllm_drops_an_extra_scheduler_stats_field_on_the_way_to_the_api_server():
    """The evidence: a subclass's field does not survive vLLM's engine-output encoding."""
    from dataclasses import dataclass

    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    @dataclass
    class WithTT(SchedulerStats):
        tt_steps: int = 0

    sent = EngineCoreOutputs(scheduler_stats=WithTT(num_running_reqs=2, tt_steps=7))
    received = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(sent))
    assert received.scheduler_stats.num_running_reqs == 2
    assert not hasattr(received.scheduler_stats, "tt_steps")
