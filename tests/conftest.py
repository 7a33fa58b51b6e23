"""Shared fixtures for cross-package and end-to-end tests: tiny checkpoints built locally."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """``tiny_checkpoint(arch)`` -> folder of a small HF checkpoint made here (no hub)."""
    from vllm_tt_host.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    built: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in built:
            built[arch] = Path(build_tiny_checkpoint(arch, root / arch, train_steps=0, seed=0))
        return built[arch]

    return make
