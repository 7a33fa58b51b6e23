"""Whether the engines record TT metrics: only for ``vllm serve`` with stats on.

The front end decides before any engine starts and says so through ``VLLM_TT_METRICS`` (the
address the engines send to), which every engine and API server process inherits.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import MutableMapping

from vllm_tt_platform.config import cli_flags
from vllm_tt_platform.envs import VLLM_TT_METRICS


def enable_tt_metrics(environ: MutableMapping[str, str] | None = None) -> bool:
    """In the process that parsed ``vllm serve``'s command line, unless ``--disable-log-stats``:
    set ``VLLM_TT_METRICS`` (kept if inherited). Offline ``vllm.LLM`` parses no command line
    and gets no metrics."""
    env = os.environ if environ is None else environ
    if not cli_flags.parsed_command_line() or cli_flags.given_value("disable_log_stats"):
        return False
    if not VLLM_TT_METRICS.read(env):
        env[VLLM_TT_METRICS.name] = f"ipc://{tempfile.gettempdir()}/vllm-tt-metrics-{os.getpid()}"
    return True
