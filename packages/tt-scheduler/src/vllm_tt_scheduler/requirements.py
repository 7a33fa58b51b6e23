"""What the phase scheduler needs from vLLM's configuration, checked once at start.

Each failure names the setting, the bad value and the fix, instead of letting a
mixed or untraceable step surface later on the device.
"""

from __future__ import annotations

from typing import Any

from vllm_tt_scheduler.carry import MERGEABLE_CONNECTORS
from vllm_tt_scheduler.options import SchedulerOptions


def check_vllm_config(vllm_config: Any, options: SchedulerOptions, max_step_tokens: int) -> None:
    """Raise ``ValueError`` when the config would let a step escape the three phases.

    Speculative decoding is allowed: a step carrying drafts only schedules running rows past
    their prefill (vLLM drops drafts of prefill chunks), so it is a decode step, one of
    ``1 + K`` tokens per row (the runner classifies rows by computed tokens, not token count).

    When the model's largest prefill trace is below the step budget and vLLM's
    per-request chunk limit (``long_prefill_token_threshold``) is unset, it is set to
    that trace length, so vLLM never schedules a longer chunk.
    """
    kv = getattr(vllm_config, "kv_transfer_config", None)
    if kv is not None and kv.kv_connector not in MERGEABLE_CONNECTORS:
        raise ValueError(
            f"KV connector {kv.kv_connector} is not supported by the TT phase scheduler (its "
            f"connector state is built per scheduling pass, and a discarded pass's metadata can be "
            f"merged only for {', '.join(MERGEABLE_CONNECTORS)}); remove --kv-transfer-config"
        )
    if getattr(vllm_config, "ec_transfer_config", None) is not None:
        raise ValueError(
            "ec_transfer_config is not supported by the TT phase scheduler (its connector "
            "state is built per scheduling pass); remove --ec-transfer-config"
        )
    cap = options.prefill_chunk_cap
    if cap is None or cap >= max_step_tokens:
        return
    sched = vllm_config.scheduler_config
    if not sched.enable_chunked_prefill:
        raise ValueError(
            f"the model's largest prefill trace is {cap} tokens, below the step budget "
            f"({max_step_tokens}), so prefills must be chunked: set enable_chunked_prefill=True"
        )
    if sched.long_prefill_token_threshold == 0:
        # Unset: the cap is the only sensible value (the platform may set it itself).
        sched.long_prefill_token_threshold = cap
    threshold = sched.long_prefill_token_threshold
    if not 0 < threshold <= cap:
        raise ValueError(
            f"long_prefill_token_threshold={threshold} exceeds the model's largest prefill "
            f"trace ({cap} tokens): set it in [1, {cap}] or leave it unset"
        )
    if sched.long_prefill_token_threshold_adaptive:
        raise ValueError(
            "long_prefill_token_threshold_adaptive=True can raise prefill chunks above the "
            f"model's largest prefill trace ({cap} tokens); set it to False"
        )
