"""Fixtures for the registry tests: bundle folders written on the fly, and clean import state."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from vllm_tt_models_registry.bundle_import import bundle_finder

TT_METAL_STYLE_ADAPTER = '''
"""A stand-in shaped like tt-metal's generator_vllm classes: a Generator base doing the work,
thin subclasses forwarding *args/**kwargs, the same method names and keyword arguments."""


class Generator:
    model_capabilities = {"supports_prefix_caching": True}

    def __init__(self, models, model_args, mesh_device):
        self.models = models

    def prefill_forward_text(self, tokens, page_table=None, kv_cache=None, prompt_lens=None,
                             empty_slots=None, enable_trace=True, sampling_params=None,
                             start_pos=None, **kwargs):
        return None

    def decode_forward(self, tokens, start_pos, page_table=None, kv_cache=None,
                       enable_trace=True, read_from_device=True, sampling_params=None,
                       reset_batch=False, prompt_tokens=None, output_tokens=None, **kwargs):
        return None

    def read_decode_output(self, tt_out, async_read=False):
        return tt_out, []

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return tt_out

    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device=False,
                             greedy_only=False):
        pass

    def warmup_model_decode(self, kv_cache, enable_trace, max_batch_size, num_blocks,
                            can_sample_on_device=False):
        pass


class {cls}(Generator):
    model_capabilities = {{
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
    }}

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len=131072,
                              n_layers=None, tt_data_parallel=1, optimizations="performance"):
        return cls([], [], mesh_device)

    @classmethod
    def get_max_tokens_all_users(cls, model_name, num_devices, tt_data_parallel, max_model_len,
                                 max_num_seqs):
        return 131072

    def allocate_kv_cache(self, *args, **kwargs):
        return []

    def prefill_forward(self, *args, **kwargs):
        return super().prefill_forward_text(*args, **kwargs)

    def decode_forward(self, *args, **kwargs):
        return super().decode_forward(*args, **kwargs)
'''


def _adapter_source(cls: str = "FooModel") -> str:
    return TT_METAL_STYLE_ADAPTER.replace("{cls}", cls).replace("{{", "{").replace("}}", "}")


@pytest.fixture
def adapter_source() -> Callable[..., str]:
    """``adapter_source(cls)`` -> source of a module defining ``cls`` the way tt-metal's
    generator classes do."""
    return _adapter_source


BundleFactory = Callable[..., Path]


@pytest.fixture
def make_bundle(tmp_path: Path) -> BundleFactory:
    """``make_bundle(name, metadata=..., files=...)`` -> a bundle folder under ``tmp_path/models``.

    By default the bundle serves ``FooForCausalLM`` from a module named after the test's
    bundle (``<name>_adapter``), so module names never collide between bundles.
    """
    root = tmp_path / "models"

    def make(
        name: str = "foo",
        metadata: Mapping[str, Any] | str | None = None,
        files: Mapping[str, str] | None = None,
    ) -> Path:
        folder = root / name
        folder.mkdir(parents=True)
        module = f"{name}_adapter"
        if metadata is None:
            metadata = {"arch": "FooForCausalLM", "main_class": f"{module}:FooModel"}
        text = metadata if isinstance(metadata, str) else json.dumps(metadata)
        (folder / "vllm_metadata.json").write_text(text)
        for rel, source in (files if files is not None else {f"{module}.py": _adapter_source()}).items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        return folder

    return make


@pytest.fixture(autouse=True)
def _forget_bundles(tmp_path: Path):
    """Bundle modules and finder claims are process state: drop those made by the test."""
    yield
    finder = bundle_finder()
    for folder in {f for f in finder.claims().values() if f.is_relative_to(tmp_path.resolve())}:
        finder.release(folder)
    # A prefix test, not Path.resolve() per module: with vLLM and torch imported that is ~10k
    # modules, and resolving each cost 10-20 s a test.
    prefixes = tuple({f"{tmp_path}{os.sep}", f"{tmp_path.resolve()}{os.sep}"})
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None) or ""
        if origin.startswith(prefixes):
            del sys.modules[name]
