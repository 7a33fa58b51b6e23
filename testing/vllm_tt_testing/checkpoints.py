"""Tiny checkpoints shared by every test of a run, and by the runs after it on this machine.

Training a tiny model costs seconds to a minute on two cores, and the host-model parity tests
and the end-to-end tests of a family want the same weights, perhaps in two pytest-xdist
workers at once. So every checkpoint is built once into a machine-wide cache, in a folder named
by its recipe and by the source of the code that builds it (a change to a recipe or to the
builder is a new folder, never a stale one), under a file lock: the second asker waits, then
finds the folder built (every builder is idempotent per recipe and writes its stamp last).
``TT_TEST_CACHE`` moves the cache (an empty folder measures a cold run).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CACHE_ENV = "TT_TEST_CACHE"


def cache_root() -> Path:
    """``$TT_TEST_CACHE``, else ``vllm-tt/test-checkpoints`` in the user's cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-tt" / "test-checkpoints"


@functools.cache
def _shared_sources() -> tuple[str, ...]:
    """What every saved checkpoint depends on besides its own recipe: the source of the
    tiny-model modules (the host's and the vision-language recipes' shared one), the corpus,
    and the torch and transformers versions. Read once per process."""
    import torch
    import transformers
    import vllm_tt_host.tiny as tiny

    from vllm_tt_testing import tiny_vl

    return (inspect.getsource(tiny), tiny.corpus_text(), inspect.getsource(tiny_vl),
            torch.__version__, transformers.__version__)


def _code_key(*parts: object) -> str:
    """Digest of ``parts`` and the shared sources."""
    digest = hashlib.sha256()
    for part in (*parts, *_shared_sources()):
        digest.update(str(part).encode())
    return digest.hexdigest()[:12]


def cached(name: str, build: Callable[[Path], Path], *recipe: object) -> Path:
    """``build(folder)`` into the machine-wide cache, once per ``name``, ``recipe`` values and
    builder source; concurrent askers (xdist workers) wait for the first."""
    from filelock import FileLock

    source = inspect.getsource(inspect.getmodule(build) or build)
    folder = cache_root() / f"{name}-{_code_key(name, source, *recipe)}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        return build(folder)


def cached_tiny(arch: str, train_steps: int = 0) -> Path:
    """The tiny ``arch`` checkpoint (``build_tiny_checkpoint``), trained ``train_steps`` steps."""
    from vllm_tt_host.tiny import build_tiny_checkpoint

    return cached(f"tiny-{arch}-{train_steps}", lambda out: build_tiny_checkpoint(arch, out, train_steps=train_steps),
                  arch, train_steps)


def cached_drafter(arch: str, num_hidden_layers: int = 1, vocab_size: int | None = None) -> Path:
    """A drafter for the untrained tiny ``arch`` target: its first ``num_hidden_layers``
    layers (``tiny_drafter.build_drafter``), same tokenizer and vocabulary unless
    ``vocab_size`` cuts it."""
    from vllm_tt_testing import tiny_drafter

    target = cached_tiny(arch)
    return cached(f"drafter-{arch}-{num_hidden_layers}-{vocab_size}",
                  lambda out: tiny_drafter.build_drafter(target, out, num_hidden_layers, vocab_size),
                  target.name, num_hidden_layers, vocab_size, inspect.getsource(tiny_drafter))


MTP_TARGET_STEPS = 120
"""The tiny DeepSeek V3 the MTP checkpoint extends (the DeepSeek V3 tests' recipe)."""


def cached_mtp(train_steps: int = 150) -> Path:
    """The tiny DeepSeek V3 with a trained MTP module (``tiny_mtp.build_mtp_checkpoint``)."""
    from vllm_tt_testing import tiny_mtp

    target = cached_tiny("deepseek_v3", MTP_TARGET_STEPS)
    return cached(f"mtp-deepseek_v3-{train_steps}",
                  lambda out: tiny_mtp.build_mtp_checkpoint(target, out, train_steps),
                  target.name, train_steps, inspect.getsource(tiny_mtp))


EAGLE3_TARGET_STEPS = 200
"""The trained tiny Llama the EAGLE-3 head drafts for (the block-output and KV offload tests' recipe)."""


def cached_eagle3(train_steps: int = 300) -> tuple[Path, Path]:
    """The trained tiny Llama and a trained EAGLE-3 head for it (``tiny_eagle3.build_eagle3_head``)."""
    from vllm_tt_testing import tiny_eagle3

    target = cached_tiny("llama", EAGLE3_TARGET_STEPS)
    head = cached(f"eagle3-llama-{train_steps}",
                  lambda out: tiny_eagle3.build_eagle3_head(target, out, train_steps),
                  target.name, train_steps, inspect.getsource(tiny_eagle3))
    return target, head


def cached_qwen_vl() -> Path:
    """The trained tiny Qwen2.5-VL (``tiny_qwen_vl.build_tiny_qwen_vl``), one checkpoint for the
    image and the video tests."""
    from vllm_tt_testing.tiny_qwen_vl import build_tiny_qwen_vl

    return cached("tiny-qwen2_5_vl-trained", build_tiny_qwen_vl)


def cached_qwen3_vl() -> Path:
    """The trained tiny Qwen3-VL (``tiny_qwen3_vl.build_tiny_qwen3_vl``), keyed by the source of
    ``tiny_qwen_vl`` too: it is built by that module's ``build_qwen_vl`` (tokenizer, chat
    template, training)."""
    from vllm_tt_testing import tiny_qwen_vl
    from vllm_tt_testing.tiny_qwen3_vl import build_tiny_qwen3_vl

    return cached("tiny-qwen3_vl-trained", build_tiny_qwen3_vl, inspect.getsource(tiny_qwen_vl))


def cached_qwen3_5_vl() -> Path:
    """The trained tiny Qwen 3.5 VL (``tiny_qwen3_5_vl.build_tiny_qwen3_5_vl``), keyed as
    ``cached_qwen3_vl`` by the source of ``tiny_qwen_vl`` too."""
    from vllm_tt_testing import tiny_qwen_vl
    from vllm_tt_testing.tiny_qwen3_5_vl import build_tiny_qwen3_5_vl

    return cached("tiny-qwen3_5_vl-trained", build_tiny_qwen3_5_vl, inspect.getsource(tiny_qwen_vl))


def cached_gemma4_vl() -> Path:
    """The trained tiny Gemma 4 VL (``tiny_gemma4_vl.build_tiny_gemma4_vl``), keyed by the
    source of ``tiny_gemma3_vl`` too: it is built by that module's ``build_gemma_vl`` and
    ``gemma_tokenizer`` (training, tokenizer)."""
    from vllm_tt_testing import tiny_gemma3_vl
    from vllm_tt_testing.tiny_gemma4_vl import build_tiny_gemma4_vl

    return cached("tiny-gemma4-vl-trained", build_tiny_gemma4_vl, inspect.getsource(tiny_gemma3_vl))


def cached_gemma4_audio(*, unified: bool = False) -> Path:
    """The trained tiny Gemma 4 with an audio tower (``unified``: Gemma 4 Unified with its audio
    embedder; ``tiny_gemma4_vl.build_tiny_gemma4_audio`` / ``..._unified_audio``), keyed as
    ``cached_gemma4_vl``."""
    from vllm_tt_testing import tiny_gemma3_vl
    from vllm_tt_testing.tiny_gemma4_vl import build_tiny_gemma4_audio, build_tiny_gemma4_unified_audio

    if unified:
        return cached("tiny-gemma4-unified-audio-trained", build_tiny_gemma4_unified_audio,
                      inspect.getsource(tiny_gemma3_vl))
    return cached("tiny-gemma4-audio-trained", build_tiny_gemma4_audio, inspect.getsource(tiny_gemma3_vl))


def cached_gemma4_unified() -> Path:
    """The trained tiny Gemma 4 Unified (``tiny_gemma4_vl.build_tiny_gemma4_unified``), keyed as
    ``cached_gemma4_vl`` by the source of ``tiny_gemma3_vl`` too."""
    from vllm_tt_testing import tiny_gemma3_vl
    from vllm_tt_testing.tiny_gemma4_vl import build_tiny_gemma4_unified

    return cached("tiny-gemma4-unified-trained", build_tiny_gemma4_unified, inspect.getsource(tiny_gemma3_vl))


def parity_fixtures(
    arch: str, train_steps: int, model_class: Any, batch: int, max_len: int, prefix: str = ""
) -> tuple[Callable[..., Path], Callable[..., Any], Callable[..., Any]]:
    """The module fixtures a host-model parity test starts from, for ``checkpoint, hf, model =
    parity_fixtures(...)`` at module level: the trained ``arch`` checkpoint, transformers' model
    of it (float32, eval) and ``model_class`` built from it on a 1x1 host mesh for ``batch``
    rows of ``max_len`` positions. ``prefix`` starts their names, for a second variant of the
    family in the same module (``e_checkpoint, e_hf, e_model``)."""

    @pytest.fixture(scope="module", name=f"{prefix}checkpoint")
    def checkpoint() -> Path:
        return cached_tiny(arch, train_steps)

    @pytest.fixture(scope="module", name=f"{prefix}hf")
    def hf(request: pytest.FixtureRequest) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        folder = request.getfixturevalue(f"{prefix}checkpoint")
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    @pytest.fixture(scope="module", name=f"{prefix}model")
    def model(request: pytest.FixtureRequest) -> Any:
        from transformers import AutoConfig
        from vllm_tt_host.device import HostMeshDevice
        from vllm_tt_platform.mesh.shape import MeshShape

        config = AutoConfig.from_pretrained(request.getfixturevalue(f"{prefix}checkpoint"))
        return model_class.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), batch, max_len)

    return checkpoint, hf, model
