"""The full flag fuzz (issue #36): seeded combinations of `vllm serve` options vLLM's parser
accepts, each built into a config through vLLM's validation and the TT platform's startup
checks (``vllm_tt_testing.flag_fuzz``), then a seeded sample of the ones that configure started
for real as `vllm serve`, each serving one greedy completion compared with transformers.

Pass: no combination ends in an untyped error, an error naming none of its options, or a hang;
every real start serves its request exactly (or fails at startup naming one of its options).

    python benchmarks/flag_fuzz.py [--combos 200] [--starts 4] [--seed 0]

Writes benchmarks/results/flag_fuzz.json and flag_fuzz.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "testing")]

from report import write_results  # noqa: E402
from vllm_tt_testing import flag_fuzz  # noqa: E402

from tests.e2e.helpers import hf_greedy, serve  # noqa: E402
from tests.e2e.pooling_checks import COSINE  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PROMPT = [5, 17, 300, 42, 8, 99, 512, 7, 64, 230]
TEXT = "the cat sat on the mat"
START_TIMEOUT_S = 420.0


def greedy_is_exact(client: Any, model: Path, name: str) -> bool:
    """One greedy completion equals transformers' ``generate``."""
    got = client.completions.create(model=name, prompt=PROMPT, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    return got.model_dump()["choices"][0]["token_ids"] == hf_greedy(model, [PROMPT], 6)[0]


def embedding_is_exact(client: Any, model: Path, name: str) -> bool:
    """One embedding (vLLM's LAST pooling of a decoder, normalised) within the embedding serve
    tests' cosine bound of transformers' last-token hidden state."""
    import torch
    from vllm_tt_testing.decoder_pooling import hf_last_token_embeddings

    got = torch.tensor([client.embeddings.create(model=name, input=TEXT).data[0].embedding])
    return torch.nn.functional.cosine_similarity(got, hf_last_token_embeddings(model, [TEXT])).item() >= COSINE


def real_start(model: Path, outcome: flag_fuzz.Outcome, log: Path) -> dict:
    """Start `vllm serve` with the outcome's arguments and send one request (a greedy completion,
    or an embedding when the configuration pools); compare with transformers."""
    import openai

    args = outcome.args
    start = time.monotonic()
    names = flag_fuzz.served_names(args) or [str(model)]
    check = embedding_is_exact if outcome.pools else greedy_is_exact
    request = "embedding" if outcome.pools else "greedy completion"
    try:
        with serve(model, *args, timeout=START_TIMEOUT_S, log=log) as url:
            exact = check(openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), model, names[0])
    except (RuntimeError, TimeoutError) as error:
        return {"args": args, "kind": "start failed", "detail": f"{error}: {log.read_text()[-1500:]}",
                "request": request, "seconds": time.monotonic() - start}
    return {"args": args, "kind": "served exactly" if exact else "served a wrong answer", "request": request,
            "seconds": time.monotonic() - start}


def markdown(r: dict) -> str:
    counts = r["counts"]
    lines = [f"# Flag fuzz ({r['date']})", "", f"`{r['command']}`", "",
             "| figure | value |", "|---|---|",
             f"| combinations vLLM's parser accepts, built into a config | {r['combos']} |"]
    lines += [f"| {kind} | {counts.get(kind, 0)} |" for kind in
              ("configured", "refused by TT", "refused by vLLM", *flag_fuzz.FINDINGS)]
    lines += [f"| drawn but not accepted by vLLM's parser (not counted) | {r['parser_rejected']} |",
              f"| config build time (mean, max) | {r['build_s']['mean']:.2f} s, {r['build_s']['max']:.2f} s |",
              f"| real `vllm serve` starts (served exactly) | {len(r['starts'])} "
              f"({sum(s['kind'] == 'served exactly' for s in r['starts'])}) |",
              f"| result | {'PASS' if r['passed'] else 'FAIL'} |", "",
              "Real starts:", ""]
    lines += [f"- `{' '.join(s['args'])}`: {s['request']}, {s['kind']} ({s['seconds']:.0f} s)" for s in r["starts"]]
    lines += ["", "Findings:", ""] + [f"- `{' '.join(f['args'])}`: {f['kind']}: {f['detail'][:300]}"
                                      for f in r["findings"]] + ["" if r["findings"] else "- none"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--combos", type=int, default=200)
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ["TT_MESH_BACKEND"] = "host"
    from vllm_tt_host.tiny import build_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(build_tiny_checkpoint("llama", Path(tmp) / "llama", train_steps=0, seed=0))
        outcomes, rejected = flag_fuzz.run(model, args.seed, args.combos)
        configured = [o for o in outcomes if o.kind == "configured"]
        sample = random.Random(args.seed).sample(configured, min(args.starts, len(configured)))
        starts = [real_start(model, a, Path(tmp) / f"serve{i}.log") for i, a in enumerate(sample)]
    builds = [o.seconds for o in outcomes]
    findings = [{"args": o.args, "kind": o.kind, "detail": o.detail} for o in outcomes if o.finding]
    findings += [s for s in starts if s["kind"] not in ("served exactly",)]
    result = {
        "date": time.strftime("%Y-%m-%d"), "command": "python benchmarks/flag_fuzz.py " + " ".join(sys.argv[1:]),
        "seed": args.seed, "combos": len(outcomes), "parser_rejected": rejected,
        "counts": dict(collections.Counter(o.kind for o in outcomes)),
        "build_s": {"mean": sum(builds) / max(len(builds), 1), "max": max(builds, default=0.0)},
        "starts": starts, "findings": findings, "passed": not findings and len(outcomes) == args.combos,
        "outcomes": [{"args": o.args, "kind": o.kind, "detail": o.detail[:500]} for o in outcomes],
    }
    write_results(result, args.out / "flag_fuzz.json", args.out / "flag_fuzz.md", markdown(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
