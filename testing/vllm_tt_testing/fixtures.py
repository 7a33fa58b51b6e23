"""Fixtures every test folder shares (loaded for every run by ``-p`` in pyproject.toml)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Callable[..., Path]:
    """``tiny_checkpoint(arch)`` -> folder of the untrained tiny ``arch`` checkpoint, made here
    (no hub) once per machine: ``vllm_tt_testing.checkpoints.cached_tiny``."""
    from vllm_tt_testing.checkpoints import cached_tiny

    return cached_tiny
