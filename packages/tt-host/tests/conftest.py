"""Shared fixtures: transformers models of the tiny checkpoints (``tiny_checkpoint`` comes from
``vllm_tt_testing.fixtures``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
