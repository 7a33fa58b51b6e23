"""Vision-language requests through ``vllm.LLM`` under a small step budget and KV pressure: the
runs the VL modules share (mixed text-only, one- and two-image prompts at once, chunks that
must end outside every image, a block pool that makes vLLM preempt and resume rows), checked
against transformers' ``generate()``: the Qwen-VL run (``assert_chunked_preempted_equal_hf``)
and the Gemma 4 run (``assert_gemma_rounds_equal_hf``: a chat template with its own bos, and a
round of long answers preempted while decoding)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e import vl_chat
from tests.e2e.helpers import metric_total, offline_llm

GEMMA_BLOCKS = 20
"""KV blocks of 32 tokens of the Gemma 4 run (its sliding and full groups take them from one
pool): 4 rows of image prompts do not fit at once."""
GEMMA_STEP_BUDGET = 80
GEMMA_LONG_TOKENS = 96
"""The long round: 4 image requests answering 96 tokens need ~34 blocks, so decoding ones are preempted."""


def assert_chunked_preempted_equal_hf(checkpoint: Path, hf_vl: tuple[Any, Any], trace: Path,
                                      requests: list[tuple[int, ...]], question: str, max_tokens: int,
                                      kv_blocks: int = 8, items_whole: bool = True,
                                      ) -> dict[tuple[int, ...], list[int]]:
    """Run ``requests`` (image kinds per prompt) at once on 4 rows, a 64-token step budget and
    ``kv_blocks`` blocks of 32 tokens (one pool: a hybrid model's state blocks come from it
    too); every prompt's ids and greedy tokens equal HF's, at least two prompts took more than
    one chunk, none ended inside an image (``items_whole``; off for a model declaring
    ``chunked_mm_input``), and vLLM preempted some. Returns the greedy tokens per request."""
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
    got = vl_chat.assert_outputs_equal_hf(requests, results, expected)
    image_token = hf_vl[0].config.image_token_id
    chunked = (vl_chat.assert_chunks_keep_images(trace, results, image_token) if items_whole else
               sum(len(ends) > 1 for ends, _ in vl_chat.item_passes(trace, results, image_token)))
    assert chunked >= 2, "the two-image prompts were prefilled in more than one chunk"
    assert preemptions > 0, f"{kv_blocks} blocks for 4 rows of up to 192 tokens each must preempt"
    return {k: g[1] for k, g in zip(requests, got, strict=True)}


def assert_gemma_rounds_equal_hf(checkpoint: Path, hf_vl: tuple[Any, Any], trace: Path,
                                 requests: list[tuple[int, ...]], long_requests: list[tuple[int, ...]],
                                 max_tokens: int) -> dict[tuple[int, ...], list[int]]:
    """One engine on 4 rows, a ``GEMMA_STEP_BUDGET``-token step budget and ``GEMMA_BLOCKS``
    blocks: ``requests`` (image kinds per prompt, request ``i`` salted ``5 + i``) side by side,
    then ``long_requests`` answering ``GEMMA_LONG_TOKENS`` tokens (salted ``30 + i``). Every
    prompt's ids and greedy tokens equal HF's, the image prompts were prefilled in chunks that
    never end inside an image, and vLLM preempted requests while decoding (it prefills prompt
    and answer again with the images). Returns the first round's greedy tokens per request."""
    from vllm import SamplingParams

    llm = vl_chat.traced_llm(trace, model=str(checkpoint), max_model_len=256, max_num_seqs=4, block_size=32,
                             num_gpu_blocks_override=GEMMA_BLOCKS, max_num_batched_tokens=GEMMA_STEP_BUDGET,
                             enable_chunked_prefill=True, enable_prefix_caching=False,
                             limit_mm_per_prompt={"image": 2, "video": 0})  # a video item outgrows the budget

    def generate(llm: Any, kinds: list[tuple[int, ...]], salt: int, tokens: int) -> list[Any]:
        return llm.generate(vl_chat.llm_prompts(hf_vl[1], kinds, salt),
                            SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)

    mixed = generate(llm, requests, 5, max_tokens)
    long = generate(llm, long_requests, 30, GEMMA_LONG_TOKENS)
    preemptions = metric_total(llm, "vllm:num_preemptions")
    del llm
    for kinds, salt, tokens, results in ((requests, 5, max_tokens, mixed),
                                         (long_requests, 30, GEMMA_LONG_TOKENS, long)):
        want = [vl_chat.hf_generate(hf_vl, k, tokens, salt + i, nested=True) for i, k in enumerate(kinds)]
        vl_chat.assert_outputs_equal_hf(kinds, results, want)
    chunked = vl_chat.assert_chunks_keep_images(trace, [*mixed, *long], hf_vl[0].config.image_token_id)
    assert chunked >= 4, "the image prompts were prefilled in chunks"
    assert preemptions > 0 and vl_chat.preempted_while_decoding(trace, long), "requests were preempted while decoding"
    return {kinds: list(r.outputs[0].token_ids) for kinds, r in zip(requests, mixed, strict=True)}
