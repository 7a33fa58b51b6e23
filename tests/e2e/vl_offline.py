"""Vision-language requests through ``vllm.LLM`` under a small step budget and KV pressure: the
run the Qwen-VL modules share (mixed text-only, one- and two-image prompts at once, chunks that
must end outside every image, a block pool that makes vLLM preempt and resume rows), checked
against transformers' ``generate()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e import vl_chat
from tests.e2e.helpers import metric_total, offline_llm


def assert_chunked_preempted_equal_hf(checkpoint: Path, hf_vl: tuple[Any, Any], trace: Path,
                                      requests: list[tuple[int, ...]], question: str, max_tokens: int,
                                      kv_blocks: int = 8) -> dict[tuple[int, ...], list[int]]:
    """Run ``requests`` (image kinds per prompt) at once on 4 rows, a 64-token step budget and
    ``kv_blocks`` blocks of 32 tokens (one pool: a hybrid model's state blocks come from it
    too); every prompt's ids and greedy tokens equal HF's, at least two prompts took more than
    one chunk, none ended inside an image, and vLLM preempted some. Returns the greedy tokens
    per request."""
    from vllm import SamplingParams

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_STEP_TRACE", str(trace))
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to read its metrics
        llm = offline_llm(model=str(checkpoint), max_model_len=192, max_num_seqs=4, block_size=32,
                          num_gpu_blocks_override=kv_blocks, max_num_batched_tokens=64, enable_chunked_prefill=True,
                          enable_prefix_caching=False, limit_mm_per_prompt={"image": 2}, seed=0,
                          disable_log_stats=False, additional_config={"tt": {"mesh_backend": "host"}})
    processor = hf_vl[1]
    prompts = [{"prompt": vl_chat.chat_text(processor, len(k), question),
                **({"multi_modal_data": {"image": vl_chat.images(k)}} if k else {})} for k in requests]
    results = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                           use_tqdm=False)
    preemptions = metric_total(llm, "vllm:num_preemptions")
    del llm
    expected = [vl_chat.hf_generate(hf_vl, k, max_tokens, question=question) for k in requests]
    got = [(list(r.prompt_token_ids), list(r.outputs[0].token_ids)) for r in results]
    assert [g[0] for g in got] == [e[0] for e in expected], "vLLM's expanded prompt ids equal HF's"
    mismatches = [(k, g[1], e[1]) for k, g, e in zip(requests, got, expected, strict=True) if g[1] != e[1]]
    assert not mismatches, mismatches
    chunked = vl_chat.assert_chunks_keep_images(trace, results, hf_vl[0].config.image_token_id)
    assert chunked >= 2, "the two-image prompts were prefilled in more than one chunk"
    assert preemptions > 0, f"{kv_blocks} blocks for 4 rows of up to 192 tokens each must preempt"
    return {k: g[1] for k, g in zip(requests, got, strict=True)}
