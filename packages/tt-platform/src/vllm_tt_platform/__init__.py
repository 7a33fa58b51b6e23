"""vllm-tt platform: serves vLLM on Tenstorrent meshes (or their host emulation)."""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger("vllm." + __name__)


def detect() -> str | None:
    """``vllm.platform_plugins`` entry point: active only where ``ttnn`` imports, so a machine
    that merely has the package installed next to another accelerator is never taken over.

    A ``ttnn`` that is installed but fails to import is said once, with the reason: otherwise
    vLLM silently picks another platform and the user only sees it run elsewhere."""
    try:
        _import_ttnn_quietly()
    except Exception as exc:  # any import failure means: not a TT machine
        if importlib.util.find_spec("ttnn") is not None:
            logger.warning(
                "Tenstorrent platform not activated: ttnn is installed but `import ttnn` failed "
                "(%s: %s). Fix the ttnn installation (docs/install.md) to serve on TT.",
                type(exc).__name__, exc,
            )
        return None
    return "vllm_tt_platform.platform.TTPlatform"


def _import_ttnn_quietly() -> None:
    """``import ttnn``, without the multi-line ``DEBUG ... Initial ttnn.CONFIG`` dump ttnn logs
    through loguru while it imports (every vLLM process would print it, and it reads like an
    error); ttnn's later log lines are unchanged. ``print(ttnn.CONFIG)`` shows the config."""
    try:
        from loguru import logger
    except ImportError:  # no loguru: ttnn cannot import either, and says so
        import ttnn  # noqa: F401

        return
    logger.disable("ttnn")
    try:
        import ttnn  # noqa: F401
    finally:
        logger.enable("ttnn")
