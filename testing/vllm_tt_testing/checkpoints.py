"""Trained tiny checkpoints shared by every test of a session.

Training a tiny model costs seconds to a minute on two cores; the host-model parity tests and
the end-to-end tests of a family want the same weights, so both ask for them here and the
second asks finds the folder built (``build_tiny_checkpoint`` is idempotent per recipe).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory, arch: str, train_steps: int) -> Path:
    """The tiny ``arch`` checkpoint trained ``train_steps`` steps, one folder per session."""
    from vllm_tt_host.tiny import build_tiny_checkpoint

    folder = tmp_path_factory.getbasetemp() / f"tiny-{arch}-trained-{train_steps}"
    return build_tiny_checkpoint(arch, folder, train_steps=train_steps)


def parity_fixtures(
    arch: str, train_steps: int, model_class: Any, batch: int, max_len: int
) -> tuple[Callable[..., Path], Callable[..., Any], Callable[..., Any]]:
    """The module fixtures a host-model parity test starts from, for ``checkpoint, hf, model =
    parity_fixtures(...)`` at module level: the trained ``arch`` checkpoint, transformers' model
    of it (float32, eval) and ``model_class`` built from it on a 1x1 host mesh for ``batch``
    rows of ``max_len`` positions."""

    @pytest.fixture(scope="module", name="checkpoint")
    def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return trained_checkpoint(tmp_path_factory, arch, train_steps)

    @pytest.fixture(scope="module", name="hf")
    def hf(checkpoint: Path) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    @pytest.fixture(scope="module", name="model")
    def model(checkpoint: Path) -> Any:
        from transformers import AutoConfig
        from vllm_tt_host.device import HostMeshDevice
        from vllm_tt_platform.mesh.shape import MeshShape

        config = AutoConfig.from_pretrained(checkpoint)
        return model_class.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), batch, max_len)

    return checkpoint, hf, model
