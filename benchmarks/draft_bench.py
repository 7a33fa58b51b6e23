"""Drafter-model benchmark: single-stream decode on the modelled device clock of Llama 3.3 70B on a
Galaxy (TG), without speculation, with n-gram drafts and with a 1B-class drafter model, K in
{1, 2, 3, 5}, at the acceptance the tiny models measure and at a swept acceptance.

The engine runs in-process on the host mesh backend with modelled device time
(``llama-3.3-70b@TG`` for the target's programs) and the tiny models' real math. The drafter is
the tiny target's first layer (``vllm_tt_testing.checkpoints.cached_drafter``); its programs
are costed as **Llama 3.2 1B on the same TG mesh** (this script sets the drafter model's costs
after the engine is built: the host backend costs every model on a mesh alike). One request at
a time, greedy, device sampling on (greedy verify steps are verified on the device).

Acceptance sweep: after the real drafter has run (its programs, hence its device time, are
unchanged), each draft is replaced by the token the target will choose there (known from the
run without speculation) with probability ``alpha``, else by another token: per-position
acceptance ``alpha``, i.i.d., so a verify step keeps on average ``(1 - alpha^(K+1)) / (1 -
alpha)`` tokens. ``alpha = 0`` is "every draft misses". For n-gram the same replacement gives
every row K drafts (n-gram drafts cost no device time). "measured" rows keep the drafters' own
drafts.

The same sweep runs for ``method: custom_class`` (the model's own drafter, ``ModelDrafts``): the
tiny target drafts with its first layer of two; its passes are costed as the first half of
Llama 3.3 70B's layers (``block_output.drafter_costs``: 40 of 80 plus the head), so a draft
costs about half a decode step and only high acceptance pays (the rows say how high).

The same sweep runs for ``method: mtp`` on **DeepSeek V3 on TG** (``deepseek-v3@TG``: its
37B active parameters as the cost model's dense equivalent), the tiny DeepSeek V3 with a
trained MTP module (``cached_mtp``) doing the math; the MTP module's programs are costed as
one of the target's layers plus its own head on the same mesh (``ProgramCosts.with_layers``).

The same sweep runs for ``method: eagle3`` on ``llama-3.3-70b@TG``: the trained tiny Llama and
its trained tiny EAGLE-3 head (``cached_eagle3``) do the math; the head's programs are costed
as a 70B EAGLE-3 head on the same mesh (``ProgramCosts.eagle3_head``: one 70B-width layer, ``fc``
over three 8192-wide states and an LM head over a 32000-id draft vocabulary, as
``yuhuili/EAGLE3-LLaMA3.3-Instruct-70B`` ships).

Targets: draft_model >= 1.8x decode tokens/s at alpha 0.7, K=3; eagle3 >= 1.8x there too; mtp
>= 1.4x at alpha 0.7, K=1; each >= 0.97x when every draft misses (K=1, 2, 3, 5).

    python benchmarks/draft_bench.py [--quick]
    python benchmarks/draft_bench.py --eagle3-only   # re-measure the eagle3 rows into the saved results

Writes benchmarks/results/draft_bench.json and draft_bench.md.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from report import bench_main, targets_lines, write_results

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "testing")]
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TT_MESH_BACKEND", "host")

from spec_bench import prompts, spec_counters  # noqa: E402  (benchmarks/ is the script's folder)

RESULTS = Path(__file__).parent / "results"
DEVICE_TIME = "llama-3.3-70b@TG"
MTP_DEVICE_TIME = "deepseek-v3@TG"
DRAFTER_PROFILE = "llama-3.2-1b"
KS = (1, 2, 3, 5)
ALPHAS: tuple[float | None, ...] = (None, 0.9, 0.7, 0.5, 0.0)
"""``None``: the drafter's own drafts (the acceptance the tiny models measure)."""
NEW_TOKENS = 64
EAGLE3_DRAFT_VOCAB = 32000
"""The draft vocabulary a 70B EAGLE-3 head is costed with (the tiny head's is 512)."""


class ScriptedAcceptance:
    """Wraps the runner's drafter: its programs run as they are, then each draft becomes the
    reference token with probability ``alpha`` (``None``: drafts untouched)."""

    def __init__(self, inner: Any, num_tokens: int, vocab: int, references: dict[tuple[int, ...], list[int]],
                 every_row: bool) -> None:
        self.inner, self.num_tokens, self.vocab, self.references = inner, num_tokens, vocab, references
        self.every_row = every_row
        """n-gram: every row gets K drafts (the n-gram drafter proposes none on most random steps)."""
        self.alpha: float | None = None
        self.rng = random.Random(31)

    def propose(self, states: list[Any]) -> list[list[int]]:
        drafts = self.inner.propose(states)
        if self.alpha is None:
            return drafts
        out = []
        for state, row in zip(states, drafts, strict=True):
            reference = self.references[tuple(state.prompt_token_ids)]
            done = len(state.output_token_ids)
            count = min(self.num_tokens if self.every_row else len(row), len(reference) - done)
            out.append([t if self.rng.random() < self.alpha else (t + 1) % self.vocab
                        for t in reference[done : done + max(count, 0)]])
        return out

    def forget(self, req_ids: Any) -> None:
        self.inner.forget(req_ids)

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        self.inner.verified(req_id, drafted, accepted)


def make_engine(model_dir: Path, method: str | None, k: int, drafter: Path | None, device_time: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm_tt_platform.config.startup_checks import MODEL_DRAFTS

    spec = {"ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1},
            "draft_model": {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": k},
            "mtp": {"method": "mtp", "num_speculative_tokens": k},
            "eagle3": {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k},
            "custom_class": {"method": "custom_class", "model": MODEL_DRAFTS, "num_speculative_tokens": k},
            None: None}[method]
    tt = {"mesh_backend": "host", "host_device_time": device_time, "sample_on_device_mode": "all"}
    return LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), max_num_seqs=1, max_model_len=512, seed=0, speculative_config=spec,
        enable_prefix_caching=False, additional_config={"tt": tt},
    ))


def runner_of(engine: Any) -> Any:
    return engine.engine_core.engine_core.model_executor.driver_worker.worker.runner


def cost_drafter_as_1b(runner: Any) -> str:
    """The drafter's programs take Llama 3.2 1B's modelled time on the target's TG mesh."""
    from vllm_tt_platform.cost.device_time import parse_device_time

    model = runner._paged_drafter.model
    costs = parse_device_time(f"{DRAFTER_PROFILE}@TG").resolve(model.costs.dims, model.device.mesh_shape, None)
    model.costs = costs
    return costs.description


def single_stream(engine: Any, workload: list[list[int]]) -> dict[str, Any]:
    """Decode tokens/s and ms per token on the device clock (first decode step to last, as
    ``spec_bench.single_stream``), vLLM's draft acceptance and the outputs, greedy."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    device = runner_of(engine).mesh_device
    drafted, accepted = spec_counters(engine)
    device_s, wall_s, tokens, outputs = 0.0, 0.0, 0, []
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(workload):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", TokensPrompt(prompt_token_ids=prompt), params)
        for out in engine.step():  # the prefill step
            assert not out.finished
        start = (device.modelled_device_seconds, time.perf_counter())
        while engine.has_unfinished_requests():
            outputs += [list(out.outputs[0].token_ids) for out in engine.step() if out.finished]
        device_s += device.modelled_device_seconds - start[0]
        wall_s += time.perf_counter() - start[1]
        tokens += NEW_TOKENS - 1
    drafted_now, accepted_now = spec_counters(engine)
    drafts = drafted_now - drafted
    return {"tokens_per_s": tokens / device_s, "ms_per_token": device_s / tokens * 1e3,
            "wall_tokens_per_s": tokens / wall_s, "draft_tokens": drafts,
            "acceptance": (accepted_now - accepted) / drafts if drafts else None, "outputs": outputs}


def sweep(model_dir: Path, device_time: str, methods: tuple[str, ...], ks: tuple[int, ...],
          workload: list[list[int]], drafter: Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """Every case of one preset: off, then each method at each K and alpha."""
    engine = make_engine(model_dir, None, 0, drafter, device_time)
    try:
        single_stream(engine, workload[:1])  # warm-up
        base = single_stream(engine, workload)
    finally:
        engine.engine_core.shutdown()
    references = {tuple(p): out for p, out in zip(workload, base["outputs"], strict=True)}
    cases: list[dict[str, Any]] = [{"method": "off", "k": 0, "alpha": None, **base}]
    drafter_costs = ""
    for method in methods:
        for k in ks:
            engine = make_engine(model_dir, method, k, drafter, device_time)
            try:
                runner = runner_of(engine)
                if method == "draft_model":
                    drafter_costs = cost_drafter_as_1b(runner)
                if method == "eagle3":  # a 70B head: 1 layer + fc + a 32000-id head
                    runner.model.eagle3_costs = runner.model.costs.eagle3_head(EAGLE3_DRAFT_VOCAB, 3)
                spec = runner.speculation
                scripted = ScriptedAcceptance(spec.drafter, k, runner.sampling.vocab_size, references,
                                              every_row=method == "ngram")
                spec.drafter = scripted
                single_stream(engine, workload[:1])  # warm-up
                for alpha in ALPHAS:
                    scripted.alpha = alpha
                    cases.append({"method": method, "k": k, "alpha": alpha, **single_stream(engine, workload)})
            finally:
                engine.engine_core.shutdown()
    for c in cases:
        c["preset"] = device_time
        c["speedup"] = c["tokens_per_s"] / base["tokens_per_s"]
        c["same_tokens_as_off"] = c.pop("outputs") == base["outputs"]
    return cases, drafter_costs


def run(count: int, ks: tuple[int, ...]) -> dict[str, Any]:
    from vllm_tt_testing.checkpoints import cached_drafter, cached_mtp, cached_tiny

    workload = prompts("random", count) + prompts("repetitive", count)
    cases, drafter_costs = sweep(cached_tiny("llama"), DEVICE_TIME, ("ngram", "draft_model", "custom_class"), ks,
                                 workload, cached_drafter("llama"))
    mtp_cases, _ = sweep(cached_mtp(), MTP_DEVICE_TIME, ("mtp",), ks, workload)
    cases += mtp_cases + eagle3_cases(count, ks)
    return {"cases": cases, "targets": targets_of(cases, ks), "drafter_costs": drafter_costs}


def eagle3_cases(count: int, ks: tuple[int, ...]) -> list[dict[str, Any]]:
    """The trained tiny Llama off and with its EAGLE-3 head (its own "off" row: another target)."""
    from vllm_tt_testing.checkpoints import cached_eagle3

    target, head = cached_eagle3()
    cases, _ = sweep(target, DEVICE_TIME, ("eagle3",), ks, prompts("random", count) + prompts("repetitive", count),
                     head)
    cases[0]["method"] = "off (eagle3 target)"
    return cases


def targets_of(cases: list[dict[str, Any]], ks: tuple[int, ...]) -> dict[str, bool]:
    by = {(c["method"], c["k"], c["alpha"]): c["speedup"] for c in cases}
    targets = {}
    if 3 in ks:
        targets["draft_model K=3 at alpha 0.7 >= 1.8x"] = by["draft_model", 3, 0.7] >= 1.8
        targets["eagle3 K=3 at alpha 0.7 >= 1.8x"] = by["eagle3", 3, 0.7] >= 1.8
    if 1 in ks:
        targets["mtp K=1 at alpha 0.7 >= 1.4x"] = by["mtp", 1, 0.7] >= 1.4
    for method in ("draft_model", "mtp", "eagle3"):
        targets[f"{method} every draft misses >= 0.97x (each K)"] = all(by[method, k, 0.0] >= 0.97 for k in ks)
    targets["tokens identical to off (greedy)"] = all(c["same_tokens_as_off"] for c in cases)
    return targets


def rerun_eagle3(results: Path = RESULTS) -> None:
    """``--eagle3-only``: the eagle3 rows measured again into the saved full run (same request
    count and K), its other rows kept as they were."""
    import json

    saved = json.loads((results / "draft_bench.json").read_text())
    ks = tuple(sorted({c["k"] for c in saved["cases"] if c["k"]}))
    kept = [c for c in saved["cases"] if c["method"] not in ("eagle3", "off (eagle3 target)")]
    cases = kept + eagle3_cases(saved["requests"] // 2, ks)
    saved |= {"cases": cases, "targets": targets_of(cases, ks),
              "command": saved["command"] + "; eagle3 rows: python benchmarks/draft_bench.py --eagle3-only"}
    write_results(saved, results / "draft_bench.json", results / "draft_bench.md", markdown(saved))


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Drafter-model, MTP and EAGLE-3 benchmark (single stream, modelled Llama 3.3 70B and DeepSeek V3 on TG)",
        "",
        f"Command: `{result['command']}`  ",
        f"Host: {result['host']}. Engine in-process, host mesh backend; target programs on the modelled "
        f"device clock `{DEVICE_TIME}`, drafter programs as `{DRAFTER_PROFILE}` on the same mesh "
        f"({result['drafter_costs']}); `mtp` rows: the tiny DeepSeek V3 with its MTP module on "
        f"`{MTP_DEVICE_TIME}` (the module costed as one target layer + its head); `eagle3` rows: the trained "
        f"tiny Llama with its EAGLE-3 head on `{DEVICE_TIME}` (the head costed as one 70B layer + fc + a "
        f"{EAGLE3_DRAFT_VOCAB}-id head; its own off row); `custom_class` rows: the "
        "tiny target's own first layer drafting, costed as the first 40 of 70B's 80 layers + head; "
        f"tiny models' real math. {result['requests']} greedy requests (half "
        f"random prompts, half repetitive), one at a time, {NEW_TOKENS} new tokens each, device sampling on. "
        "alpha: per-position acceptance forced by replacing drafts after the drafter ran (see the script); "
        "'measured': the drafter's own drafts. acceptance = vLLM's accepted / proposed drafts. tokens/s, "
        "ms/token (mean inter-token latency) and speed-up are on the modelled device clock.",
        "",
        "| preset | method | K | alpha | tokens/s | ms/token | speed-up | acceptance (drafts) | wall tokens/s "
        "| same tokens |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in result["cases"]:
        alpha = "-" if c["method"].startswith("off") else ("measured" if c["alpha"] is None else f"{c['alpha']:.1f}")
        accepted = "-" if c["acceptance"] is None else f"{c['acceptance']:.0%} ({c['draft_tokens']})"
        lines.append(f"| {c['preset']} | {c['method']} | {c['k'] or '-'} | {alpha} | {c['tokens_per_s']:.1f} | "
                     f"{c['ms_per_token']:.2f} | {c['speedup']:.2f}x | {accepted} | {c['wall_tokens_per_s']:.1f} | "
                     f"{'yes' if c['same_tokens_as_off'] else 'NO'} |")
    return "\n".join(lines + targets_lines(result["targets"])) + "\n"


def main() -> None:
    if sys.argv[1:] == ["--eagle3-only"]:
        rerun_eagle3()
        return
    bench_main(__doc__, "draft_bench", "one request per workload, K=1 and 3 only (smoke run)",
               lambda quick: {"requests": 2 * (1 if quick else 2), **run(*((1, (1, 3)) if quick else (2, KS)))},
               markdown, RESULTS)


if __name__ == "__main__":
    main()
