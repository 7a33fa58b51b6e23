"""Shared fixtures: tiny HF checkpoints, built once per test session from the package itself."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_checkpoint(arch)`` -> folder of the untrained tiny ``arch`` checkpoint."""
    from vllm_tt_host.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return lambda arch: build_tiny_checkpoint(arch, root / arch)


@pytest.fixture(scope="session")
def hf_reference(tiny_checkpoint: Callable[[str], Path]) -> Callable[[str], object]:
    """``hf_reference(arch)`` -> the transformers model of that checkpoint (float32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM

    cache: dict[str, object] = {}

    def load(arch: str) -> object:
        if arch not in cache:
            model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint(arch), dtype=torch.float32)
            cache[arch] = model.eval()
        return cache[arch]

    return load
