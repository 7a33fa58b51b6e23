"""Helpers for end-to-end tests: a `vllm serve` process on loopback, and HF reference output."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


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


@contextlib.contextmanager
def serve_process(model: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600.0,
                  log: Path | None = None) -> Iterator[Server]:
    """Run ``vllm serve`` on 127.0.0.1 in its own process group and yield it once /health
    answers; afterwards it is stopped and nothing of its tree is left running."""
    port = free_port()
    full_env = {**os.environ, "TT_MESH_BACKEND": "host", **(env or {})}
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
          log: Path | None = None) -> Iterator[str]:
    """Run ``vllm serve`` on 127.0.0.1 and yield its base URL once /health answers."""
    with serve_process(model, *args, env=env, timeout=timeout, log=log) as server:
        yield server.url


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
