"""Qwen 3.5 vision-language through vLLM's engine on the host mesh backend: vLLM's own Qwen 3.5
processor (Qwen3-VL's: uint8 pixels, the checkpoint's 0.5 mean / std), the tower inside the
prefill, interleaved mRoPE on the rotated quarter of each head with the returned deltas on
decode, and the hybrid KV (one recurrent-state block per request for each delta-net layer,
paged K/V for the attention layer). Greedy outputs equal transformers' generate() token for
token for text-only, one-image and two-image requests side by side with a 64-token step budget
(the two-image prompts are prefilled in chunks, the delta-net states carried across them; with
prefix caching on, vLLM's ``align`` mode ends chunks on block boundaries, inside an image if
need be, which the model takes: ``chunked_mm_input``):

* through ``vllm.LLM``, with a block pool small enough that vLLM preempts rows and resumes them
  (a fresh prefill: the recurrent states recomputed from the prompt, the images' towers and the
  mRoPE delta again);
* through ``vllm serve`` on a Galaxy (``MESH_DEVICE=TG``) split into two data-parallel ranks of
  4 rows (the model is not single-program: each rank is its own engine on its sub-mesh, with its
  own state blocks and deltas), OpenAI chat with base64 ``image_url`` data URLs; every rank
  serves image requests; two mp4 ``video_url`` data URLs each equal transformers fed the frames
  vLLM's loader decodes from the same bytes, and give different answers. Audio, too many images or videos and undecodable image or video bytes
  are answered with a 400 and the next request is served (videos themselves:
  ``test_qwen_vl_video.py``).

The image decides the answer: the one-image requests of different kinds get different answers
(the tiny checkpoint leads with an attention layer so that it learns to; see
``tiny_qwen3_5_vl``)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import pytest
from vllm_tt_testing.checkpoints import cached_qwen3_5_vl

from tests.e2e import vl_chat
from tests.e2e.helpers import metric_per_engine, metric_total, serve
from tests.e2e.vl_chat import VIDEO_BAD_REQUESTS, VIDEO_LIMITS, image_parts
from tests.e2e.vl_offline import assert_chunked_preempted_equal_hf

pytestmark = pytest.mark.e2e

MAX_TOKENS = 16
REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (2, 3), (1, 0)]
"""Image kinds per request: five at once on two ranks of four rows."""
QUESTION = " ".join([vl_chat.QUESTION] * 6)
"""With two images this question makes a prompt longer than the 64-token step budget."""


@pytest.fixture(scope="module")
def checkpoint():
    return cached_qwen3_5_vl()


def test_llm_generate_with_images_equals_transformers_chunked_and_preempted(checkpoint, tmp_path):
    """Seven mixed requests (``vl_chat.REQUESTS``) on 4 rows: 10 blocks of 32 tokens, of which
    each running request holds its delta-net layers' state blocks and its K/V blocks (4-5), make
    vLLM preempt rows; a resumed row's
    delta-net states start again from zero over its history."""
    assert_chunked_preempted_equal_hf(checkpoint, vl_chat.load_hf(checkpoint), tmp_path / "steps.jsonl",
                                      vl_chat.REQUESTS, QUESTION, MAX_TOKENS, kv_blocks=10, items_whole=False)


def test_llm_prefix_cache_hits_and_chunks_inside_images_equal_transformers(checkpoint, tmp_path):
    """Prefix caching on (vLLM's ``align`` mode: a delta-net state per 32-token block, chunks
    ending on block boundaries, inside an image if need be, which the model takes:
    ``chunked_mm_input``), one request at a time, 32-token chunks: a two-image prompt (images
    at 7..23 and 25..41) whose first chunk ends inside its second image; the same prompt again,
    a hit of two blocks past both images (vLLM sends no pixels for them); the same images with
    another question, twice: the first misses (vLLM 0.33 keeps delta-net states at sparse
    block boundaries, and from then on the one where the two prompts part), the second hits
    one block, which ends inside the second image. Every answer equals transformers'."""
    from vllm import SamplingParams

    hf_vl = vl_chat.load_hf(checkpoint)
    trace = tmp_path / "steps.jsonl"
    llm = vl_chat.traced_llm(trace, model=str(checkpoint), max_model_len=192, max_num_seqs=4, block_size=32,
                             max_num_batched_tokens=64, long_prefill_token_threshold=32, enable_chunked_prefill=True,
                             enable_prefix_caching=True, limit_mm_per_prompt={"image": 2, "video": 0})
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    asked = [QUESTION, QUESTION, vl_chat.QUESTION, vl_chat.QUESTION]
    results, hits = [], []
    for question in asked:
        prompt = {"prompt": vl_chat.chat_text(hf_vl[1], 2, question),
                  "multi_modal_data": {"image": vl_chat.images((2, 3), 5)}}
        before = metric_total(llm, "vllm:prefix_cache_hits")
        results += llm.generate([prompt], greedy, use_tqdm=False)
        hits.append(metric_total(llm, "vllm:prefix_cache_hits") - before)
    del llm
    expected = [vl_chat.hf_generate(hf_vl, (2, 3), MAX_TOKENS, 5, question=q) for q in asked]
    got = vl_chat.assert_outputs_equal_hf(["two images", "again", "another question", "again"], results, expected)
    runs = vl_chat.image_runs(got[0][0], hf_vl[0].config.image_token_id)
    assert runs == [(7, 23), (25, 41)], runs
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    ends = vl_chat.chunk_ends(steps, results[0].request_id, len(got[0][0]))
    assert [e for e in ends if any(first < e < stop for first, stop in runs)], ("a chunk ends inside an image", ends)
    assert hits == [0, 64, 0, 32], hits


def hf_answers(checkpoint: Path) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """transformers' (prompt ids, greedy tokens) per request of ``REQUESTS`` and its greedy
    tokens for the one-image request sent after each refusal."""
    hf_vl = vl_chat.load_hf(checkpoint)
    answers = [vl_chat.hf_generate(hf_vl, kinds, MAX_TOKENS, 5 + salt, add_special_tokens=False, question=QUESTION)
               for salt, kinds in enumerate(REQUESTS)]
    after = vl_chat.hf_generate(hf_vl, (2,), MAX_TOKENS, 11, add_special_tokens=False)[1]
    return answers, after


def test_serve_chat_with_base64_images_in_two_ranks_equals_transformers_and_refuses_bad_input(checkpoint, tmp_path):
    """transformers runs beside the server's start (its imports take as long)."""
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    with concurrent.futures.ThreadPoolExecutor(1) as oracle:
        expected = oracle.submit(hf_answers, checkpoint)
        lane_args, lane_env = vl_chat.lane_serve(4, trace)
        with serve(checkpoint, "--max-model-len", "256", *lane_args, "--max-num-batched-tokens", "64",
                   "--limit-mm-per-prompt", VIDEO_LIMITS, env=lane_env, log=log) as url:
            with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
                answers = list(pool.map(lambda ks: vl_chat.post_chat(url, model, image_parts(ks[1], 5 + ks[0]),
                                                                     MAX_TOKENS, QUESTION),
                                        enumerate(REQUESTS)))
            refusals, after = {}, {}
            for name, parts in VIDEO_BAD_REQUESTS.items():
                refusals[name] = vl_chat.post_chat(url, model, parts or image_parts((0, 1, 2), 9), MAX_TOKENS)
                after[name] = vl_chat.post_chat(url, model, image_parts((2,), 11), MAX_TOKENS)  # still serving
            videos = vl_chat.video_parts(vl_chat.VIDEO_SALTS)
            video_answers = [vl_chat.post_chat(url, model, [part], MAX_TOKENS) for part in videos]
            served = {name: metric_per_engine(url, f"vllm:{name}_total") for name in ("request_success", "prompt_tokens")}
        hf, hf_after = expected.result()
    for response in [*answers, *after.values()]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    for kinds, response, (prompt, tokens) in zip(REQUESTS, answers, hf, strict=True):
        body = response.json()
        assert body["prompt_token_ids"] == prompt, kinds
        assert body["choices"][0]["token_ids"] == tokens, kinds
    assert hf[REQUESTS.index((0,))][1] != hf[REQUESTS.index((1,))][1], "the image decides the answer"
    vl_chat.assert_videos_equal_hf(checkpoint, vl_chat.load_hf(checkpoint), videos, video_answers, MAX_TOKENS, log)
    assert all(r.json()["choices"][0]["token_ids"] == hf_after for r in after.values())
    for name, response in refusals.items():
        assert response.status_code == 400, (name, response.status_code, response.text)
        assert response.json()["error"]["message"], name
    assert "At most 2 image(s)" in refusals["three images"].json()["error"]["message"]
    assert "At most 1 video(s)" in refusals["two videos"].json()["error"]["message"]
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    passes = [vl_chat.chunk_ends(steps, r.json()["id"], len(r.json()["prompt_token_ids"])) for r in answers]
    assert sum(len(p) > 1 for p in passes) >= 2, ("the two-image prompts were prefilled in more than one chunk", passes)
    text_only = len(answers[REQUESTS.index(())].json()["prompt_token_ids"])
    successes, prompt_tokens = served["request_success"], served["prompt_tokens"]
    assert set(successes) == {"0", "1"} and all(successes.values()), served
    assert all(prompt_tokens[e] > successes[e] * text_only for e in successes), ("every rank served an image", served)
    log_text = log.read_text()
    assert all(f"DP rank {r} (local {r} of 2)" in log_text for r in range(2)), log_text[-3000:]
