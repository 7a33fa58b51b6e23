"""Arms a fault injector on the emulated device from ``TT_HOST_FAULTS``: the seam that lets a
test put one inside a ``vllm serve`` process tree. The injectors themselves are test support
(``vllm_tt_testing``); the platform only has the null hooks (``vllm_tt_platform.faults``)."""

from __future__ import annotations

import importlib

from vllm.logger import init_logger
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.faults import Faults

logger = init_logger("vllm." + __name__)


def load_faults(spec: str, setting: str = "TT_HOST_FAULTS") -> Faults:
    """The fault injector ``spec`` (``module:factory``) names, built by calling the factory."""
    module_name, sep, name = spec.partition(":")
    allowed = "`module:factory`, a callable returning a vllm_tt_platform.faults.Faults"
    fix = f"unset {setting} (it is for tests), or name an importable factory"
    if not sep or not module_name or not name:
        raise TTConfigError(setting, spec, allowed, fix)
    try:
        factory = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise TTConfigError(setting, spec, allowed, f"{fix} ({exc})") from exc
    faults = factory()
    if not isinstance(faults, Faults):
        raise TTConfigError(setting, spec, allowed, f"{fix} (it returned {type(faults).__name__})")
    logger.warning("TT host device: fault injector %s installed (%r); for tests only", spec, faults)
    return faults
