"""vllm-tt platform: serves vLLM on Tenstorrent meshes (or their host emulation)."""

from __future__ import annotations


def detect() -> str | None:
    """``vllm.platform_plugins`` entry point: active only where ``ttnn`` imports, so a machine
    that merely has the package installed next to another accelerator is never taken over."""
    try:
        import ttnn  # noqa: F401
    except Exception:  # any import failure means: not a TT machine
        return None
    return "vllm_tt_platform.platform.TTPlatform"
