"""KV offload benchmark: multi-turn chat whose working set is 4x the device KV pool, with
``--kv-offloading-size`` (native backend, the TT transfer handler) against the same engine
without it (evicted prefixes are recomputed), on the modelled device clock of Llama 3.1 8B on an
N150.

The engine runs in-process on the host mesh backend with the tiny Llama's real math; what each
request reused is measured there: the tokens it found on the device (vLLM's prefix cache) and
those loaded from host memory (the connector's hits, read from vLLM's counters after each
request). Requests run one at a time, so a request's time to first token is its own work on the
cost model (``ProgramCosts``, the same the host backend replays): copying the loaded tokens' KV
over the host link (``kv_transfer_s``), then prefilling the rest in chunks of the step budget
after the reused prefix (``prefill_s``).

Workload: ``CONVERSATIONS`` chats, each turn its whole history (a system prompt of its own, the
earlier turns, ``USER_TOKENS`` new user tokens) answered with ``REPLY_TOKENS`` tokens; turns go
round-robin, so every history has left the device before its chat comes back. Target: mean TTFT
with offload <= 0.5x recompute.

    python benchmarks/offload_bench.py [--quick]

Writes benchmarks/results/offload_bench.json and offload_bench.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from report import write_results

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "testing")]
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TT_MESH_BACKEND", "host")

COST_MODEL = "llama-3.1-8b@N150"
BLOCK = 64
DEVICE_BLOCKS = 34
"""33 usable blocks (2,112 tokens, one ``MAX_MODEL_LEN`` request); block 0 is vLLM's null block."""
MAX_MODEL_LEN = 2112
CONVERSATIONS = 5
SYSTEM_TOKENS = 1280
USER_TOKENS = 96
REPLY_TOKENS = 16
STEP_TOKENS = 512
"""``max_num_batched_tokens``: the prefill chunk."""
OFFLOAD_GIB = 0.25
TARGET = 0.5


def _turns(vocab: int, turns: int) -> list[list[int]]:
    """Each request's prompt (token ids), round-robin over the chats; replies are filled in as
    the engine answers (see ``_run``), so the prompts here hold the user parts only."""
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(SYSTEM_TOKENS if t == 0 else USER_TOKENS)]
            for t in range(turns) for _ in range(CONVERSATIONS)]


def _external_hits(llm: Any) -> float:
    return sum(float(m.value) for m in llm.get_metrics() if m.name == "vllm:external_prefix_cache_hits")


def _run(offload: bool, turns: int, model_dir: Path) -> list[dict[str, int]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra: dict[str, Any] = {"kv_offloading_size": OFFLOAD_GIB} if offload else {}
    llm = LLM(model=str(model_dir), max_num_seqs=1, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=STEP_TOKENS,
              num_gpu_blocks_override=DEVICE_BLOCKS, enable_prefix_caching=True, disable_log_stats=False, seed=0,
              additional_config={"tt": {"mesh_backend": "host"}}, **extra)
    vocab = llm.get_tokenizer().vocab_size
    parts = _turns(vocab, turns)
    histories: list[list[int]] = [[] for _ in range(CONVERSATIONS)]
    params = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS, ignore_eos=True)
    requests = []
    for index, part in enumerate(parts):
        chat = histories[index % CONVERSATIONS]
        chat.extend(part)
        before = _external_hits(llm)
        out = llm.generate([TokensPrompt(prompt_token_ids=list(chat))], params, use_tqdm=False)[0]
        loaded = int(_external_hits(llm) - before)
        requests.append({"prompt": len(chat), "cached": out.num_cached_tokens or 0, "loaded": loaded})
        chat.extend(out.outputs[0].token_ids)
    del llm
    return requests


def _ttft_s(costs: Any, request: dict[str, int]) -> float:
    """Copy the loaded tokens' KV in, then prefill the rest after the reused prefix, chunk by chunk."""
    start, end = request["cached"], request["prompt"]
    seconds = costs.kv_transfer_s(request["loaded"]) if request["loaded"] else 0.0
    while start < end:
        chunk = min(STEP_TOKENS, end - start)
        seconds += costs.prefill_s(chunk, start)
        start += chunk
    return seconds


def _summary(costs: Any, requests: list[dict[str, int]]) -> dict[str, Any]:
    later = requests[CONVERSATIONS:]  # a chat's first turn has nothing to reuse in either run
    prompt = sum(r["prompt"] for r in later)
    return {
        "requests": len(requests),
        "prefix_hit_rate": sum(r["cached"] for r in later) / prompt,
        "loaded_from_host_share": sum(r["loaded"] for r in later) / prompt,
        "mean_ttft_ms": 1e3 * statistics.fmean(_ttft_s(costs, r) for r in later),
        "per_request": requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 turns per chat instead of 5")
    args = parser.parse_args()
    from vllm_tt_platform.cost.device_time import MODEL_PROFILES, parse_device_time
    from vllm_tt_platform.mesh.shape import MESH_PRESETS
    from vllm_tt_testing.checkpoints import cached_tiny

    spec = parse_device_time(COST_MODEL)
    assert spec.mesh_preset is not None and spec.model is not None
    costs = spec.resolve(MODEL_PROFILES[spec.model], MESH_PRESETS[spec.mesh_preset], spec.mesh_preset)
    turns = 3 if args.quick else 5
    model_dir = cached_tiny("llama", 200)
    runs = {name: _summary(costs, _run(offload, turns, model_dir))
            for name, offload in (("recompute", False), ("offload", True))}
    ratio = runs["offload"]["mean_ttft_ms"] / runs["recompute"]["mean_ttft_ms"]
    working_set = CONVERSATIONS * max(r["prompt"] for r in runs["offload"]["per_request"])
    pool = (DEVICE_BLOCKS - 1) * BLOCK
    result = {
        "cost_model": COST_MODEL, "device_pool_tokens": pool, "working_set_tokens": working_set,
        "conversations": CONVERSATIONS, "turns": turns, "offload_gib": OFFLOAD_GIB,
        "ttft_ratio": ratio, "target": TARGET, "meets_target": ratio <= TARGET,
        "runs": runs, "machine": platform.machine(), "python": platform.python_version(),
    }
    rows = "\n".join(
        f"| {name} | {run['prefix_hit_rate']:.1%} | {run['loaded_from_host_share']:.1%} | {run['mean_ttft_ms']:.1f} |"
        for name, run in runs.items()
    )
    table = (
        f"# KV offload: multi-turn chat, working set {working_set} tokens = {working_set / pool:.1f}x the device "
        f"pool ({pool} tokens)\n\n"
        f"Modelled clock: {COST_MODEL}; {CONVERSATIONS} chats x {turns} turns, round-robin; turns after the "
        f"first of each chat.\n\n"
        "| run | prefix hit rate | loaded from host | mean TTFT (ms) |\n|---|---|---|---|\n"
        f"{rows}\n\nTTFT offload / recompute: **{ratio:.2f}x** (target <= {TARGET}x: "
        f"{'met' if ratio <= TARGET else 'missed'}).\n\n"
        "Command: `python benchmarks/offload_bench.py` (in the tests(0.33) env).\n"
    )
    results = REPO / "benchmarks" / "results"
    write_results(result, results / "offload_bench.json", results / "offload_bench.md", table)


if __name__ == "__main__":
    main()
