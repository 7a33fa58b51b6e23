"""The vLLM API differences inside the support window that the platform must absorb.

Each shim probes vLLM (an attribute, a function's behaviour) rather than its version, and has
a tombstone in ``tests/test_compat.py`` that fails once the lowest supported vLLM no longer
needs it. docs/support-policy.md says how shims are added and removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
from pathlib import Path

from vllm.utils import system_utils

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
