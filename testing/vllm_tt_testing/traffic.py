"""OpenAI traffic against one ``vllm serve``, for the stream, soak and connection tests.

Requests are sent with one ``httpx.AsyncClient`` (thousands of connections on one thread);
every answer is checked as it arrives: status, stream framing (one finish reason, ``[DONE]``
last, nothing after it), and - for greedy requests - the text against the same request sent
alone (``references``). Cancelled requests (the client closes the connection at a random point)
are only checked not to have failed before they were cut.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import resource
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

MODEL = "tiny"
"""``--served-model-name`` of the servers these tools start."""


@dataclass(frozen=True)
class Spec:
    """One request: what is sent, and how the client behaves."""

    key: str
    """Reference key: greedy requests with the same key must give the same text."""
    prompt: str
    max_tokens: int
    stream: bool
    greedy: bool = True
    cancel_after: int | None = None
    """Close the connection after this many stream events (or, not streaming, this many ms)."""
    extra: tuple[tuple[str, Any], ...] = ()
    """More request fields (logprobs, stop, response_format, seed, ...)."""
    compare: bool = True
    """Whether the text must equal the reference (greedy without stop strings or grammars)."""

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens,
                                "ignore_eos": True, "stream": self.stream}
        if self.greedy:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, top_p=0.95)
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        body.update(dict(self.extra))
        return body


@dataclass
class Outcome:
    spec: Spec
    status: int
    text: str = ""
    tokens: int | None = None
    finish_reason: str | None = None
    cancelled: bool = False
    problem: str | None = None
    """Why this answer is wrong (None: fine)."""


def connection_per_request(max_connections: int, timeout: httpx.Timeout | float) -> httpx.AsyncClient:
    """A client that opens a new connection for every request and never reuses one.

    A pooled connection is checked for expiry when a request picks it, not when the request is
    written: a client whose event loop runs seconds late (CPU-starved, thousands of events to
    parse) writes after the server's keep-alive (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s) has
    closed the connection, and gets a reset (``httpx.ReadError``) that the server never logs.
    These tools test the server, so they keep that client-side race out (docs/reliability.md).
    """
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=0)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


async def send(client: httpx.AsyncClient, url: str, spec: Spec) -> Outcome:
    """Send ``spec`` and check its answer's framing (not its text: see ``check_texts``). A
    transport failure's problem names the whole request and what the connection had done."""
    probe = Probe(asyncio.get_running_loop().time())
    try:
        if spec.stream:
            return await _stream(client, url, spec, probe)
        if spec.cancel_after is not None:
            try:
                return await asyncio.wait_for(_plain(client, url, spec, probe), spec.cancel_after / 1000)
            except TimeoutError:
                return Outcome(spec, 0, cancelled=True)
        return await _plain(client, url, spec, probe)
    except httpx.HTTPError as exc:
        return Outcome(spec, 0, problem=f"{type(exc).__name__}: {exc!r}; {probe.describe(spec)}")


@dataclass
class Probe:
    """What one request's connection did (httpcore's trace events), for diagnosing failures."""

    started: float
    wall_started: float = field(default_factory=time.time)
    events: list[tuple[float, str]] = field(default_factory=list)
    local_port: int | None = None
    stream_events: int = 0

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        self.events.append((asyncio.get_running_loop().time() - self.started, name))
        stream = info.get("return_value")
        if name == "connection.connect_tcp.complete" and stream is not None:
            self.local_port = stream.get_extra_info("client_addr")[1]

    def describe(self, spec: Spec) -> str:
        fresh = any(name.startswith("connection.connect_tcp") for _, name in self.events)
        steps = ", ".join(f"{name.removeprefix('http11.')}@{t * 1000:.0f}ms" for t, name in self.events)
        sent = time.strftime("%H:%M:%S", time.gmtime(self.wall_started))
        return (f"sent {sent} UTC on a {'new' if fresh else 'reused'} connection (local port {self.local_port}), "
                f"{self.stream_events} stream events, connection: {steps}; cancel_after={spec.cancel_after}; "
                f"body={json.dumps(spec.body())}")


async def _plain(client: httpx.AsyncClient, url: str, spec: Spec, probe: Probe | None = None) -> Outcome:
    extensions = {"trace": probe.trace} if probe else None
    response = await client.post(f"{url}/v1/completions", json=spec.body(), extensions=extensions)
    if response.status_code != 200:
        return Outcome(spec, response.status_code, problem=f"HTTP {response.status_code}: {response.text[:300]}")
    body = response.json()
    choice = body["choices"][0]
    return Outcome(spec, 200, choice["text"], body["usage"]["completion_tokens"], choice["finish_reason"])


async def _stream(client: httpx.AsyncClient, url: str, spec: Spec, probe: Probe) -> Outcome:
    async with client.stream("POST", f"{url}/v1/completions", json=spec.body(),
                             extensions={"trace": probe.trace}) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            return Outcome(spec, response.status_code, problem=f"HTTP {response.status_code}: {text[:300]}")
        events: list[str] = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            probe.stream_events = len(events)
            if spec.cancel_after is not None and len(events) >= spec.cancel_after and events[-1] != "[DONE]":
                out = _parse_stream(spec, events, complete=False)
                out.cancelled = True
                return out  # leaving the block closes the connection mid-stream
    return _parse_stream(spec, events, complete=True)


def _parse_stream(spec: Spec, events: list[str], *, complete: bool) -> Outcome:
    out = Outcome(spec, 200)
    if complete and (not events or events[-1] != "[DONE]"):
        out.problem = f"stream did not end with [DONE] (last: {events[-1:]})"
    if events.count("[DONE]") > (1 if complete else 0):
        out.problem = "[DONE] sent more than once"
    parts, reasons = [], []
    for event in events:
        if event == "[DONE]":
            continue
        chunk = json.loads(event)
        if "error" in chunk:
            out.problem = f"error event: {event[:300]}"
            continue
        for choice in chunk.get("choices", ()):
            parts.append(choice.get("text", ""))
            if choice.get("finish_reason"):
                reasons.append(choice["finish_reason"])
        if chunk.get("usage"):
            out.tokens = chunk["usage"]["completion_tokens"]
    out.text = "".join(parts)
    if complete and len(reasons) != 1 and out.problem is None:
        out.problem = f"{len(reasons)} finish reasons: {reasons}"
    out.finish_reason = reasons[0] if reasons else None
    return out


def check(outcome: Outcome, references: dict[str, str]) -> str | None:
    """What is wrong with a finished ``outcome``, or None."""
    if outcome.problem or outcome.cancelled:
        return outcome.problem
    spec = outcome.spec
    extra = dict(spec.extra)
    if "stop" not in extra and "response_format" not in extra and outcome.tokens != spec.max_tokens:
        return f"{outcome.tokens} tokens, asked for {spec.max_tokens} (finish reason {outcome.finish_reason})"
    if spec.greedy and spec.compare and outcome.text != references[spec.key]:
        return f"text differs from the single-request output: {outcome.text[:80]!r} vs {references[spec.key][:80]!r}"
    return None


async def references(url: str, specs: Sequence[Spec]) -> dict[str, str]:
    """The text of each greedy key, from the request sent alone (not streaming, no extras)."""
    out: dict[str, str] = {}
    async with connection_per_request(4, 300) as client:
        for spec in specs:
            if spec.greedy and spec.compare and spec.key not in out:
                alone = Spec(spec.key, spec.prompt, spec.max_tokens, stream=False)
                answer = await _plain(client, url, alone)
                if answer.problem:
                    raise RuntimeError(f"reference request {spec.key} failed: {answer.problem}")
                out[spec.key] = answer.text
    return out


@dataclass
class Drained:
    running: float
    waiting: float
    kv_usage: float
    waited_s: float


def metric(text: str, name: str) -> float:
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


async def drained(url: str, timeout_s: float = 120.0) -> Drained:
    """Poll ``/metrics`` until nothing runs or waits and no KV block is in use (or time out)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            text = (await client.get(f"{url}/metrics")).text
            state = Drained(metric(text, "vllm:num_requests_running"), metric(text, "vllm:num_requests_waiting"),
                            metric(text, "vllm:kv_cache_usage_perc"), loop.time() - start)
            if (state.running, state.waiting, state.kv_usage) == (0, 0, 0) or state.waited_s > timeout_s:
                return state
            await asyncio.sleep(0.5)


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's open-file soft limit to its hard limit (children inherit it);
    returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass
class Tally:
    """Counts of a run, by outcome."""

    finished: int = 0
    cancelled: int = 0
    problems: list[str] = field(default_factory=list)
    by_kind: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: Outcome, references: dict[str, str]) -> None:
        problem = check(outcome, references)
        if problem:
            self.problems.append(f"{outcome.spec.key} ({'stream' if outcome.spec.stream else 'plain'}): {problem}")
        elif outcome.cancelled:
            self.cancelled += 1
        else:
            self.finished += 1
        self.by_kind[_kind(outcome.spec)] += 1


def _kind(spec: Spec) -> str:
    parts = ["stream" if spec.stream else "plain", "greedy" if spec.greedy else "sampled"]
    parts += sorted(k for k, _ in spec.extra)
    if spec.cancel_after is not None:
        parts.append("cancel")
    return "+".join(parts)


def prompts(n: int, seed: int) -> list[str]:
    """``n`` distinct prompts of 1 to ~60 words from the tiny model's corpus."""
    words = (resources.files("vllm_tt_host") / "corpus.txt").read_text().split()
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        start = rng.randrange(len(words) - 64)
        text = " ".join(words[start:start + rng.choice((1, 3, 8, 20, 60))])
        if text not in out:
            out.append(text)
    return out


@dataclass
class StreamsRun:
    """``run_streams``' figures."""

    streams: int
    finished: int
    cancelled: int
    problems: list[str]
    elapsed_s: float
    peak_open_fds: dict[str, int]
    """Most file descriptors open at once, per process of the server tree (and this client)."""
    drained: Drained


def stream_specs(n: int, seed: int, cancel_fraction: float = 0.25) -> list[Spec]:
    """``n`` greedy streams over a few prompts and lengths; ``cancel_fraction`` of them are
    cut by the client after a random number of events."""
    rng = random.Random(seed)
    texts = prompts(24, seed)
    specs = []
    for i in range(n):
        p, max_tokens = rng.randrange(len(texts)), rng.choice((8, 16, 32))
        cancel = rng.randint(1, max_tokens) if rng.random() < cancel_fraction else None
        specs.append(Spec(f"p{p}-n{max_tokens}", texts[p], max_tokens, stream=True, cancel_after=cancel))
        del i
    return specs


def open_fds(pids: Sequence[int]) -> dict[int, int]:
    counts = {}
    for pid in pids:
        try:
            counts[pid] = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
    return counts


async def run_streams(url: str, specs: Sequence[Spec], server_pids: Callable[[], Sequence[int]]) -> StreamsRun:
    """All ``specs`` at once on one client (one connection each), checked against references
    taken first; then wait until the server has drained."""
    import os

    refs = await references(url, specs)
    loop = asyncio.get_running_loop()
    peak: Counter[str] = Counter()
    done = asyncio.Event()

    async def watch_fds() -> None:
        while not done.is_set():
            for pid, count in open_fds([*server_pids(), os.getpid()]).items():
                name = "client" if pid == os.getpid() else f"server pid {pid}"
                peak[name] = max(peak[name], count)
            await asyncio.sleep(0.5)

    start = loop.time()
    watcher = asyncio.create_task(watch_fds())
    async with connection_per_request(len(specs) + 16, httpx.Timeout(900, connect=120)) as client:
        outcomes = await asyncio.gather(*(send(client, url, s) for s in specs))
    elapsed = loop.time() - start
    done.set()
    await watcher
    tally = Tally()
    for outcome in outcomes:
        tally.add(outcome, refs)
    return StreamsRun(len(specs), tally.finished, tally.cancelled, tally.problems, elapsed, dict(peak),
                      await drained(url))

