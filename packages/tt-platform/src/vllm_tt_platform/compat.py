"""The vLLM API differences inside the support window that the platform must absorb.

Each shim probes vLLM (an attribute, a function's behaviour) rather than its version, and has
a tombstone in ``tests/test_compat.py`` that fails once the lowest supported vLLM no longer
needs it. docs/support-policy.md says how shims are added and removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.utils import system_utils
from vllm.v1.engine import utils as engine_utils

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec

logger = init_logger("vllm." + __name__)

_OMP_PAUSE_HARD = 2
"""``omp_pause_resource_t`` value that joins every OpenMP worker thread (OpenMP 5.0)."""

VLLM_RELEASES_OPENMP_BEFORE_FORK = "libgomp" in inspect.getsource(system_utils.get_mp_context)
"""vLLM 0.33+ pauses libgomp before forking the engine core. Without that, a process that ran
any multi-threaded torch CPU op (a host model, a reference forward) forks an engine core that
deadlocks in its first parallel region (e.g. allocating the host KV cache)."""

_registered = False


def loaded_libgomp_paths(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """Paths of the libgomp copies mapped into this process (torch may bundle its own)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    paths = {line.split()[-1] for line in lines if "libgomp" in line and line.split()[-1].startswith("/")}
    return sorted(paths)


def pause_openmp() -> int:
    """Join libgomp's idle worker threads (they are recreated on the next parallel region);
    returns how many libgomp copies were paused."""
    paused = 0
    for path in loaded_libgomp_paths():
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).omp_pause_resource_all(_OMP_PAUSE_HARD)
            paused += 1
    return paused


def release_openmp_before_fork() -> bool:
    """Where vLLM does not, pause OpenMP right before every ``fork`` of this process (the
    engine core is forked by default); returns whether the hook is (now) registered."""
    global _registered
    if VLLM_RELEASES_OPENMP_BEFORE_FORK:
        return False
    if not _registered:
        os.register_at_fork(before=pause_openmp)
        _registered = True
    return True


HAS_KV_CACHE_PLANNING = importlib.util.find_spec("vllm.v1.core.kv_cache_planning") is not None
"""vLLM 0.33 moved KV cache grouping from ``vllm.v1.core.kv_cache_utils`` to
``vllm.v1.core.kv_cache_planning`` (same ``get_kv_cache_groups(vllm_config, kv_cache_spec)``)."""


def kv_cache_groups(vllm_config: VllmConfig, spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """The KV cache groups vLLM's engine core will build from ``spec`` (on a copy: vLLM may
    rewrite the specs it is given)."""
    module = "vllm.v1.core.kv_cache_planning" if HAS_KV_CACHE_PLANNING else "vllm.v1.core.kv_cache_utils"
    return importlib.import_module(module).get_kv_cache_groups(vllm_config, dict(spec))


ENGINE_CLEANUP_WINDOW_S = 5
"""How long the EngineCore may take, after an immediate abort (``--shutdown-timeout 0``), to
send the aborted requests back and close the mesh before vLLM kills it (vLLM's own default for
``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``). The answers leave at once; the rest is teardown."""

_CLEANUP_WINDOW_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"

VLLM_GRANTS_CLEANUP_WINDOW_ON_REQUEST = _CLEANUP_WINDOW_ENV in inspect.getsource(
    engine_utils.get_engine_process_shutdown_timeout
)
"""vLLM 0.33+ gives the EngineCore a cleanup window after an abort-mode SIGTERM when
``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` is set (ROCm alone gets one unasked). Without a window
the process manager SIGKILLs the core right after its SIGTERM: the aborted requests are never
sent back, the API server waits on them for as long as the clients keep their connections,
and the mesh is not closed."""


def grant_engine_cleanup_window(vllm_config: VllmConfig) -> bool:
    """With ``--shutdown-timeout 0``, ask vLLM for ``ENGINE_CLEANUP_WINDOW_S`` of EngineCore
    teardown after SIGTERM (a ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` the user set is kept);
    returns whether a window was asked for. A drain timeout already is the core's window."""
    if vllm_config.shutdown_timeout != 0:
        return False
    if not VLLM_GRANTS_CLEANUP_WINDOW_ON_REQUEST:
        logger.warning_once(
            "This vLLM kills the TT EngineCore as soon as it sends it SIGTERM when "
            "--shutdown-timeout is 0: requests in flight at SIGTERM/SIGINT are never answered "
            "(the API server waits on them) and the mesh is not closed. Fix: pass "
            "--shutdown-timeout N (drain for up to N seconds), or use vLLM >= 0.33."
        )
        return False
    os.environ.setdefault(_CLEANUP_WINDOW_ENV, str(ENGINE_CLEANUP_WINDOW_S))
    return True


def _scheduler_stats_carry_platform_stats() -> bool:
    from dataclasses import fields

    from vllm.v1.metrics.stats import SchedulerStats

    return any(word in f.name for f in fields(SchedulerStats) for word in ("platform", "plugin", "custom"))


VLLM_STATS_CARRY_PLATFORM_STATS = _scheduler_stats_carry_platform_stats()
"""Whether vLLM's ``SchedulerStats`` (engine core -> API server, read by stat-logger plugins) has
a field for a platform's own stats. Through 0.33 it has none, and its msgpack decoding drops
any extra field, so ``vllm_tt_platform.metrics`` sends the TT step deltas over its own ZMQ
socket instead; once vLLM carries platform stats, they should ride there."""
