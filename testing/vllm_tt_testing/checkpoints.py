"""Trained tiny checkpoints shared by every test of a session.

Training a tiny model costs seconds to a minute on two cores; the host-model parity tests and
the end-to-end tests of a family want the same weights, so both ask for them here and the
second asks finds the folder built (``build_tiny_checkpoint`` is idempotent per recipe).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory, arch: str, train_steps: int) -> Path:
    """The tiny ``arch`` checkpoint trained ``train_steps`` steps, one folder per session."""
    from vllm_tt_platform.host.tiny import build_tiny_checkpoint

    folder = tmp_path_factory.getbasetemp() / f"tiny-{arch}-trained-{train_steps}"
    return build_tiny_checkpoint(arch, folder, train_steps=train_steps)
