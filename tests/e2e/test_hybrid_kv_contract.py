"""Hybrid KV through vLLM's engine: a host Llama whose even layers use a sliding window
(declared with ``get_kv_cache_spec``) is served with vLLM's hybrid KV cache manager, which frees
the blocks a window leaves behind and hands them to other requests while they still sit in the
runner's block tables. Every model call is checked for the contract's per-layer tables, and the
greedy outputs must equal those of the same model served with every block kept
(``--disable-hybrid-kv-cache-manager``): dropping and reusing blocks changes nothing.

The model class is served from a bundle written by the test; the engine core runs in-process
so the test reads what the model recorded.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM

from tests.e2e.helpers import offline_llm

pytestmark = pytest.mark.e2e

WINDOW = 40
BLOCK = 32
MAX_NUM_SEQS = 4
MAX_NEW_TOKENS = 12


class WindowedLlama(HybridKVCausalLM):
    """The host Llama with a ``WINDOW``-token sliding window on its even layers; records a
    summary of every call's block tables (checked by the test)."""

    family = "llama"
    calls: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def decoder_config(cls, hf_config: Any, n_layers: int | None = None) -> Any:
        config = super().decoder_config(hf_config, n_layers)
        windows = tuple(WINDOW if layer % 2 == 0 else None for layer in range(config.num_layers))
        return dataclasses.replace(config, layer_windows=windows)

    def _record(self, kind: str, kwargs: dict[str, Any], rows: list[int], starts: list[int],
                ends: list[int]) -> None:
        tables = kwargs.get("page_tables_per_layer")
        type(self).calls.append({
            "kind": kind, "rows": rows, "starts": starts, "ends": ends,
            "page_table": kwargs["page_table"].clone(),
            "tables": None if tables is None else [t.clone() for t in tables],
        })

    def prefill_forward(self, *args: Any, **kwargs: Any) -> Any:
        starts = [int(s) for s in kwargs["start_pos"]]
        ends = [int(e) for e in kwargs["prompt_lens"]]
        self._record("prefill", kwargs, list(range(len(ends))), starts, ends)
        return super().prefill_forward(*args, **kwargs)

    def decode_forward(self, *args: Any, **kwargs: Any) -> Any:
        positions = kwargs["start_pos"].tolist()
        rows = [row for row, p in enumerate(positions) if p >= 0]
        self._record("decode", kwargs, rows, [positions[r] for r in rows], [positions[r] + 1 for r in rows])
        return super().decode_forward(*args, **kwargs)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bundles") / "windowed_llama"
    folder.mkdir()
    (folder / "windowed_llama.py").write_text(
        "from tests.e2e.test_hybrid_kv_contract import WindowedLlama\n"
    )
    (folder / "vllm_metadata.json").write_text(json.dumps({
        "arch": "LlamaForCausalLM", "main_class": "windowed_llama:WindowedLlama",
        "description": "host Llama with sliding-window even layers (hybrid KV contract test)",
        "min_plugin_version": "0.1.0",
    }))
    return folder.parent


def _serve(model_dir: Path, bundle: Path, prompts: list[list[int]], **engine_args: Any) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the test reads WindowedLlama.calls
        patch.setenv("EXTRA_MODELS_DIR", str(bundle))
        llm = offline_llm(model=str(model_dir), max_num_seqs=MAX_NUM_SEQS, max_model_len=256, block_size=BLOCK,
                  seed=0, num_gpu_blocks_override=160, enable_prefix_caching=False,
                  additional_config={"tt": {"mesh_backend": "host"}}, **engine_args)
        try:
            params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
            results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            return [list(r.outputs[0].token_ids) for r in results]
        finally:
            del llm


def _check_call(call: dict[str, Any]) -> int:
    """The contract's tables for one call; returns how many in-window entries were zeroed."""
    tables = call["tables"]
    assert tables is not None and len(tables) == 2, "no page_tables_per_layer"
    assert all(t.dtype == torch.int32 and tuple(t.shape) == (MAX_NUM_SEQS, 256 // BLOCK) for t in tables)
    sliding, full = tables
    rows = len(call["page_table"])
    assert torch.equal(call["page_table"], sliding[:rows]), "page_table is not the first group's table"
    live: dict[int, str] = {}
    dropped = 0
    for row, start, end in zip(call["rows"], call["starts"], call["ends"], strict=True):
        first = max(start - (WINDOW - 1), 0) // BLOCK
        last = (end - 1) // BLOCK
        assert all(int(b) != 0 for b in full[row, : last + 1]), f"full row {row} has a hole: {full[row]}"
        assert all(int(b) != 0 for b in sliding[row, first : last + 1]), f"window not covered: {sliding[row]}"
        assert not sliding[row, :first].any(), f"blocks left behind the window are not zeroed: {sliding[row]}"
        dropped += first
        for name, table in (("sliding", sliding), ("full", full)):
            for block in table[row, : last + 1].tolist():
                if block:
                    owner = f"{row}/{name}"
                    assert live.setdefault(block, owner) == owner, f"block {block} is live twice in one step"
    for row in set(range(MAX_NUM_SEQS)) - set(call["rows"]):
        assert not sliding[row].any() and not full[row].any(), f"padding row {row} is not zeros"
    return dropped


def test_dropped_window_blocks_change_no_output(tiny_checkpoint, bundle):
    model_dir = tiny_checkpoint("llama")
    rng = random.Random(7)
    lengths = [3, 20, 40, 64, 90, 120, 150, 33, 17, 100]  # more prompts than rows: requests queue and join
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]

    WindowedLlama.calls.clear()
    hybrid = _serve(model_dir, bundle, prompts)
    calls = [c for c in WindowedLlama.calls if c["rows"]]  # warmup calls have no rows
    assert {c["kind"] for c in calls} == {"prefill", "decode"}
    dropped = sum(_check_call(c) for c in calls)
    assert dropped > 0, "no window ever moved past a block: the test proves nothing"

    WindowedLlama.calls.clear()
    kept = _serve(model_dir, bundle, prompts, disable_hybrid_kv_cache_manager=True)
    assert all(c["tables"] is not None for c in WindowedLlama.calls if c["rows"]), "a declared spec always gets per-layer tables"
    mismatches = [(len(p), h, k) for p, h, k in zip(prompts, hybrid, kept, strict=True) if h != k]
    assert not mismatches, f"{len(mismatches)} prompts differ (len, hybrid KV, every block kept): {mismatches[:3]}"
