"""Helpers for end-to-end tests: a `vllm serve` process on loopback, and HF reference output."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from vllm_tt_testing.suite_clock import engine_started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "vllm"), *args]


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    """``vllm serve`` itself: the leader of a process group holding the whole server tree."""
    url: str


SPAWN = "spawn"
"""``vllm serve``'s own default start method for the engine core (what users run), kept by the
tests of the README's server, shutdown and multi-host; the others fork it from the API server,
which saves the engine core's second import of vLLM and torch (about a third of a start)."""


@contextlib.contextmanager
def serve_process(model: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600.0,
                  log: Path | None = None, start_method: str = "fork") -> Iterator[Server]:
    """Run ``vllm serve`` on 127.0.0.1 in its own process group and yield it once /health
    answers; afterwards it is stopped and nothing of its tree is left running."""
    port = free_port()
    full_env = {**os.environ, "TT_MESH_BACKEND": "host", "VLLM_WORKER_MULTIPROC_METHOD": start_method, **(env or {})}
    engine_started("serve")
    log_file = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        vllm_command("serve", str(model), "--host", "127.0.0.1", "--port", str(port), *args),
        env=full_env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}" + (f"; log: {log}" if log else ""))
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not become healthy in {timeout}s")
            time.sleep(1)
        yield Server(proc, url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if not isinstance(log_file, int):
            log_file.close()


@contextlib.contextmanager
def serve(model: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600.0,
          log: Path | None = None, start_method: str = "fork") -> Iterator[str]:
    """Run ``vllm serve`` on 127.0.0.1 and yield its base URL once /health answers."""
    with serve_process(model, *args, env=env, timeout=timeout, log=log, start_method=start_method) as server:
        yield server.url


def offline_llm(**engine_args: Any) -> Any:
    """``vllm.LLM(**engine_args)``, counted by the suite clock."""
    from vllm import LLM

    engine_started("llm")
    return LLM(**engine_args)


@dataclass
class Hosts:
    url: str
    head: subprocess.Popen
    headless: subprocess.Popen
    head_log: Path
    headless_log: Path


def _start_serve(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(vllm_command("serve", *args), env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def two_hosts(model: Path, root: Path, dp: int, local: int, *args: str, env: dict[str, str] | None = None,
              timeout: float = 420.0) -> Iterator[Hosts]:
    """Two process trees on loopback as two hosts: the head (ranks 0..local-1 and the OpenAI
    server, model name ``tiny``) and one ``--headless`` host (the next ``local`` ranks)."""
    port, rpc = free_port(), free_port()
    full_env = {**os.environ, "TT_MESH_BACKEND": "host", "VLLM_HOST_IP": "127.0.0.1",
                "VLLM_WORKER_MULTIPROC_METHOD": SPAWN, **(env or {})}
    common = [str(model), "--data-parallel-size", str(dp), "--data-parallel-size-local", str(local),
              "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc), *args]
    head_log, headless_log = root / "head.log", root / "headless.log"
    engine_started("two-hosts")
    head = _start_serve([*common, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
                   "--api-server-count", "1"], full_env, head_log)
    headless = _start_serve([*common, "--headless", "--data-parallel-start-rank", str(local)], full_env, headless_log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            for proc, log in ((head, head_log), (headless, headless_log)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{log.stem} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the head did not become healthy in {timeout}s")
            time.sleep(2)
        yield Hosts(url, head, headless, head_log, headless_log)
    finally:
        _stop_group(headless)
        _stop_group(head)


def living_group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the processes in group ``pgid`` that still run (zombies have exited; only their
    parent's ``wait`` is missing)."""
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def hf_greedy(model_dir: Path, prompts: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations from transformers' own generate() in float32, never stopping early."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    # generate() fills a None eos_token_id in from the checkpoint's generation config, so a
    # trained model would stop at its eos token; clear the default too.
    model.generation_config.eos_token_id = None
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False,
        eos_token_id=None, pad_token_id=0, bos_token_id=None,
    )
    outputs = []
    with torch.no_grad():
        for ids in prompts:
            result = model.generate(  # type: ignore[misc]  # transformers' generate() stub
                torch.tensor([ids]), generation_config=config,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
            outputs.append(result[0, len(ids):].tolist())
    return outputs


def seeded_prompts(seed: int, lengths: Sequence[int]) -> list[list[int]]:
    """Random token prompts of ``lengths`` (ids 3..999: no special tokens of the tiny vocab)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]


def offline_greedy(llm: Any, prompts: Sequence[list[int]], max_tokens: int) -> list[list[int]]:
    """``llm.generate`` of token prompts, greedy and never stopping early: each answer's ids."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(r.outputs[0].token_ids) for r in results]


def greedy_one_by_one(llm: Any, prompts: Sequence[list[int]], max_tokens: int) -> list[tuple[list[int], int]]:
    """Each token prompt on its own, in order (a later one may hit an earlier one's prefix),
    greedy and never stopping early: its answer's ids and how many prompt tokens hit vLLM's
    prefix cache (``num_cached_tokens``, on the device or loaded from an offload pool)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = []
    for prompt in prompts:
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        results.append((list(out.outputs[0].token_ids), out.num_cached_tokens))
    return results


def served_metric(url: str, name: str, label: str = "") -> float:
    """The sum of a server's ``/metrics`` samples named ``name`` (over its label sets), keeping
    only those whose labels hold ``label`` (``'phase="decode"'``) when one is given."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        sample, _, value = line.rpartition(" ")
        if (sample == name or sample.startswith(name + "{")) and label in sample:
            total += float(value)
    return total


def metric_total(llm: Any, name: str) -> int:
    """The sum of an offline engine's metric ``name`` (``vllm:num_preemptions``, ...)."""
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


def metric_per_engine(url: str, name: str) -> dict[str, float]:
    """A server's counter ``name`` (``vllm:request_success_total``, ...) summed per engine
    index, from its /metrics."""
    import re

    import httpx

    per_engine: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and (engine := re.search(r'engine="(\d+)"', line)):
            per_engine[engine.group(1)] = per_engine.get(engine.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return per_engine


def assert_greedy_equal(prompts: Sequence[list[int]], got: Sequence[list[int]],
                        expected: Sequence[list[int]]) -> None:
    """Every prompt's tokens equal; the message names the first three that differ."""
    bad = [(len(p), g, e) for p, g, e in zip(prompts, got, expected, strict=True) if list(g) != list(e)]
    assert not bad, f"{len(bad)} of {len(prompts)} prompts differ (len, vllm, hf): {bad[:3]}"


def concurrent_greedy(url: str, prompts: Sequence[list[int]], max_tokens: int, model: str = "tiny",
                      ) -> list[list[int]]:
    """Every prompt sent at once, one OpenAI client thread each (greedy, never stopping early);
    the token ids of each answer, in prompt order."""
    import concurrent.futures

    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")

    def complete(prompt: list[int]) -> list[int]:
        result = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        ).model_dump()
        return result["choices"][0]["token_ids"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(complete, prompts))


def repetitive_prompts(vocab: int) -> list[list[int]]:
    """Prompts that repeat a phrase (the n-gram drafter finds its continuation) and two random
    ones (drafts mostly miss): the speculative decoding tests' workload."""
    rng = random.Random(19)
    out = []
    for length, repeats in ((6, 5), (9, 4), (4, 8), (12, 3), (5, 6), (7, 5)):
        phrase = [rng.randrange(3, vocab) for _ in range(length)]
        out.append(phrase * repeats)
    out += [[rng.randrange(3, vocab) for _ in range(n)] for n in (40, 90)]
    return out
