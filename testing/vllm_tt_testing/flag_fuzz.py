"""The flag fuzz (issue #36): seeded combinations of ``vllm serve`` options that vLLM's own
parser accepts, drawn from the serve surface's works and refused classes, each built into a
config through the same path ``vllm serve`` takes (vLLM's parser with the platform's hook,
``EngineArgs.create_engine_config``: vLLM's validation, then the TT platform's startup checks).

Each combination must either configure, or fail with a typed error naming one of its options
(a ``TTConfigError`` naming the option, or vLLM's own validation error naming it); anything
else (an untyped exception, an error naming none of the options, a build past its time limit)
is a finding. A real engine start serving one request is the costly part: the benchmark
(``benchmarks/flag_fuzz.py``) starts a seeded sample of the configurations that pass.
"""

from __future__ import annotations

import argparse
import copy
import functools
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_tt_platform.config import cli_flags
from vllm_tt_platform.config.serve_surface import SURFACE, flag
from vllm_tt_platform.config.surface import Support, resolve
from vllm_tt_platform.errors import TTConfigError

_NGRAM = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}'

KNOBS: dict[str, tuple[tuple[str, ...], ...]] = {
    "max_model_len": (("256",), ("512",)),
    "max_num_seqs": (("1",), ("4",)),
    "max_num_batched_tokens": (("64",), ("512",)),
    "block_size": (("32",), ("64",), ("16",)),
    "enable_prefix_caching": (("--enable-prefix-caching",), ("--no-enable-prefix-caching",)),
    "async_scheduling": (("--async-scheduling",), ("--no-async-scheduling",)),
    "enforce_eager": (("--enforce-eager",),),
    "enable_chunked_prefill": (("--enable-chunked-prefill",), ("--no-enable-chunked-prefill",)),
    "seed": (("0",), ("7",)),
    "max_logprobs": (("0",), ("5",)),
    "tokenizer_mode": (("auto",), ("hf",)),
    "generation_config": (("auto",), ("vllm",)),
    "override_generation_config": (('{"max_new_tokens": 8}',), ('{"temperature": 0.5}',)),
    "scheduling_policy": (("fcfs",), ("priority",)),
    "served_model_name": (("a",), ("a", "b")),
    "disable_log_stats": (("--disable-log-stats",),),
    "additional_config": (("--additional-config.tt.trace_mode", "decode_only"),
                          ("--additional-config.tt.trace_mode", "none"),
                          ("--additional-config.tt.sample_on_device_mode", "all"),
                          ("--additional-config.tt.trace_mod", "all")),
    "speculative_config": ((_NGRAM,), (_NGRAM.replace('"ngram"', '"ngram_gpu"'),)),
    "data_parallel_size": (("2",),),
    "tensor_parallel_size": (("1",), ("2",)),
    "pipeline_parallel_size": (("2",),),
    "enable_lora": (("--enable-lora",),),
    "enable_sleep_mode": (("--enable-sleep-mode",),),
    "enable_prompt_embeds": (("--enable-prompt-embeds",),),
    "data_parallel_backend": (("ray",),),
    "kv_transfer_config": (('{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}',),
                           ('{"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"}',),
                           ('{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',)),
    "kv_offloading_size": (("1",),),
    "kv_offloading_backend": (("native",), ("lmcache",)),
    "convert": (("embed",), ("classify",)),
    "runner": (("generate",), ("pooling",)),
    "enable_expert_parallel": (("--enable-expert-parallel",),),
    "enable_dbo": (("--enable-dbo",),),
    "cpu_offload_gb": (("1",),),
    "enable_return_routed_experts": (("--enable-return-routed-experts",),),
}
"""Values to draw per option destination: a value alone follows the option; a tuple starting
with ``--`` is the whole of the tokens (switches, ``--additional-config.tt.*`` keys)."""


def knob_classes() -> dict[str, Support | None]:
    """The serve-surface class of each fuzzed destination (all must be works or refused)."""
    return {dest: (r.entry.support if (r := resolve(dest, SURFACE)).entry else None) for dest in KNOBS}


def tokens(dest: str, value: tuple[str, ...]) -> list[str]:
    return list(value) if value[0].startswith("--") else [flag(dest), *value]


def combinations(seed: int, count: int, most: int = 4) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """``count`` seeded combinations of 1 to ``most`` distinct options: (destinations, tokens)."""
    rng = random.Random(seed)
    dests = sorted(KNOBS)
    for _ in range(count):
        chosen = tuple(sorted(rng.sample(dests, rng.randint(1, most))))
        yield chosen, [t for d in chosen for t in tokens(d, rng.choice(KNOBS[d]))]


@dataclass
class Outcome:
    args: list[str]
    kind: str
    """``configured``, ``refused by TT``, ``refused by vLLM``, ``not accepted by vLLM's parser``
    (not counted), or a finding: ``unnamed error``, ``untyped error``, ``hang``."""
    detail: str = ""
    seconds: float = 0.0
    config: Any = field(default=None, repr=False)
    pools: bool = False
    """A configured engine that pools (``--runner pooling``, or ``--convert`` which implies it):
    a real start of it serves embeddings, not completions."""

    @property
    def finding(self) -> bool:
        return self.kind in FINDINGS


FINDINGS = ("unnamed error", "untyped error", "hang")


def names_an_option(message: str, dests: tuple[str, ...]) -> bool:
    """Whether ``message`` names one of ``dests`` (as ``--flag``, ``flag-name`` or ``dest``)."""
    text = message.lower()
    return any(d in text or flag(d)[2:] in text or d.replace("_", " ") in text
               or d.removeprefix("enable_").replace("_", " ") in text for d in dests)


def classify(error: BaseException, dests: tuple[str, ...], values: tuple[str, ...] = ()) -> tuple[str, str]:
    """The outcome kind of a failed build: typed and named, or a finding. vLLM's own errors may
    name the value given instead (``Failed to import Ray`` for ``--data-parallel-backend ray``)."""
    from pydantic import ValidationError

    message = f"{type(error).__name__}: {error}"
    if isinstance(error, TTConfigError):
        return ("refused by TT" if names_an_option(error.setting, dests) else "unnamed error"), message
    if isinstance(error, ValidationError | ValueError | NotImplementedError):
        # vLLM's own config validation: typed by vLLM; it must name an option given.
        named = names_an_option(str(error), dests) or any(v.lower() in str(error).lower() for v in values)
        return ("refused by vLLM" if named else "unnamed error"), message
    return "untyped error", message


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


@functools.cache
def serve_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s parser as the serve front end builds it (vLLM runs the TT platform's
    ``pre_register_and_update`` hook in it); once: the hook wraps the parser's actions."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.31, 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[no-redef,import-not-found]
    return make_arg_parser(FlexibleArgumentParser())


def build(model: Path, dests: tuple[str, ...], args: list[str], timeout_s: float = 120.0) -> Outcome:
    """Parse ``args`` as ``vllm serve <model> args`` would, then build the engine config."""
    import contextlib
    import io

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    cli_flags.forget()
    parser = serve_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            namespace = parser.parse_args([str(model), *args])
    except SystemExit:
        return Outcome(args, "not accepted by vLLM's parser")
    # vLLM's parser defaults include config objects that EngineArgs mutates in place (e.g.
    # aux_output_config for --enable-return-routed-experts): each build gets its own copy.
    namespace = copy.deepcopy(namespace)
    namespace.model = str(model)
    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        config = AsyncEngineArgs.from_cli_args(namespace).create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER)
    except _Timeout:
        return Outcome(args, "hang", f"no config in {timeout_s:g} s", time.monotonic() - start)
    except Exception as error:  # noqa: BLE001 - the classification is the point
        words = tuple(a for a in args if not a.startswith(("--", "{")) and not a.isdigit() and len(a) > 2)
        kind, detail = classify(error, dests, words)
        return Outcome(args, kind, detail, time.monotonic() - start)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(args, "configured", "", time.monotonic() - start, config,
                   pools=config.model_config.runner_type == "pooling")


def run(model: Path, seed: int, count: int) -> tuple[list[Outcome], int]:
    """``count`` combinations vLLM's parser accepts, and how many drawn it did not accept."""
    outcomes: list[Outcome] = []
    rejected = 0
    for dests, args in combinations(seed, count * 4):
        outcome = build(model, dests, args)
        if outcome.kind == "not accepted by vLLM's parser":
            rejected += 1
            continue
        outcome.config = None
        outcomes.append(outcome)
        if len(outcomes) == count:
            break
    return outcomes, rejected


def served_names(args: list[str]) -> list[str]:
    """The ``--served-model-name`` values of ``args`` (the first is the one to ask for)."""
    if "--served-model-name" not in args:
        return []
    rest = args[args.index("--served-model-name") + 1:]
    return [a for a in rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]]
