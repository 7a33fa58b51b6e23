"""Per-batch choice between sampling on the TT device and vLLM's host sampler.

A TT model samples a whole call at once, so the choice is per batch: one request that needs a
feature the device lacks sends its neighbours to the host sampler too. The function here is pure
(no vLLM import, no state) so the runner can call it every step and tests can pin every rule.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_tt_sampling.params import DEVICE_TOP_K
from vllm_tt_sampling.stats import SamplingStats
from vllm_tt_sampling.wire import to_device_params

if TYPE_CHECKING:
    from vllm import SamplingParams

__all__ = [
    "DeviceSamplingCaps",
    "DeviceSamplingMode",
    "RowSampling",
    "SamplingDecision",
    "SamplingPath",
    "SamplingStats",
    "choose_sampling_path",
    "drafts_blocked_by",
    "to_device_params",
]

SAMPLING_EPS = 1e-5
"""vLLM's threshold below which a temperature means greedy."""

NO_DEVICE_LOGPROBS = -1
"""``DeviceSamplingCaps.max_logprobs`` of a model that returns no logprobs at all."""


class DeviceSamplingMode(enum.Enum):
    """Operator setting ``sample_on_device_mode``: which phases may sample on device."""

    ALL = "all"
    DECODE_ONLY = "decode_only"


class SamplingPath(enum.Enum):
    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True)
class DeviceSamplingCaps:
    """What the model's on-device sampler can do, from its declared capabilities."""

    max_top_k: int = DEVICE_TOP_K
    """Largest top-k the device honours exactly."""
    penalties: bool = True
    """Presence/frequency/repetition penalties are applied on device."""
    max_logprobs: int = 0
    """Largest ``SamplingParams.logprobs`` served: 0 = the sampled token's logprob only,
    ``NO_DEVICE_LOGPROBS`` = none."""


@dataclass(frozen=True)
class RowSampling:
    """What one scheduled request asks of the sampler, reduced to the facts the choice needs."""

    greedy: bool
    top_k: int
    """vLLM's value: 0 or -1 = disabled (the whole vocabulary)."""
    penalties: bool
    logprobs: int | None
    """vLLM's value: None = none, 0 = sampled token, n = top-n, -1 = whole vocabulary."""
    logprob_token_ids: bool = False
    prompt_logprobs: bool = False
    allowed_token_ids: bool = False
    bad_words: bool = False
    min_p: bool = False
    logit_bias: bool = False
    min_tokens: bool = False
    logits_processors: bool = False
    thinking_budget: bool = False
    structured_output: bool = False
    intermediate_chunk: bool = False

    @classmethod
    def from_vllm(
        cls,
        params: SamplingParams,
        *,
        structured_output: bool,
        intermediate_chunk: bool,
        logits_processors_configured: bool = False,
        num_output_tokens: int | None = None,
    ) -> RowSampling:
        """View of vLLM ``SamplingParams`` plus what only the runner knows.

        ``logits_processors_configured``: custom logits processors are loaded (they may act on
        any request). ``num_output_tokens``: when given, ``min_tokens`` stops counting once met.
        """
        min_tokens = params.min_tokens > 0 and (
            num_output_tokens is None or num_output_tokens < params.min_tokens
        )
        return cls(
            greedy=params.temperature < SAMPLING_EPS,
            top_k=params.top_k,
            penalties=(
                params.presence_penalty != 0.0
                or params.frequency_penalty != 0.0
                or params.repetition_penalty != 1.0
            ),
            logprobs=params.logprobs,
            logprob_token_ids=bool(getattr(params, "logprob_token_ids", None)),
            prompt_logprobs=params.prompt_logprobs is not None,
            allowed_token_ids=bool(params.allowed_token_ids),
            bad_words=bool(params.bad_words) or bool(params.bad_words_token_ids),
            min_p=params.min_p > SAMPLING_EPS,
            logit_bias=bool(params.logit_bias),
            min_tokens=min_tokens,
            logits_processors=logits_processors_configured or bool(params.extra_args),
            thinking_budget=getattr(params, "thinking_token_budget", None) is not None,
            structured_output=structured_output or params.structured_outputs is not None,
            intermediate_chunk=intermediate_chunk,
        )


@dataclass(frozen=True)
class SamplingDecision:
    path: SamplingPath
    reason: str
    """Stable short code: ``"device"`` or why the batch could not sample on device."""


def _top_k_exceeds(row: RowSampling, caps: DeviceSamplingCaps) -> bool:
    # Greedy rows ignore top-k. A disabled top-k (<= 0) means the whole vocabulary, which the
    # device cannot do: tt-metal silently maps k < 1 to 32, changing the distribution.
    if row.greedy:
        return False
    return row.top_k < 1 or row.top_k > caps.max_top_k


def _logprobs_exceed(row: RowSampling, caps: DeviceSamplingCaps) -> bool:
    if row.logprob_token_ids:
        return True
    if row.logprobs is None:
        return False
    if caps.max_logprobs < 0 or row.logprobs < 0:
        return True
    return row.logprobs > caps.max_logprobs


_RowCheck = Callable[[RowSampling, DeviceSamplingCaps, bool], bool]
"""A rule: (row, caps, prefill) -> the row breaks it."""

# Checked in this order; the first rule any row breaks names the reason. Keep the codes stable:
# they appear in step traces and logs.
_ROW_CHECKS: tuple[tuple[str, _RowCheck], ...] = (
    ("structured_output", lambda r, c, p: r.structured_output),
    ("intermediate_chunk", lambda r, c, p: r.intermediate_chunk),
    ("allowed_token_ids", lambda r, c, p: r.allowed_token_ids),
    ("bad_words", lambda r, c, p: r.bad_words),
    ("min_p", lambda r, c, p: r.min_p),
    ("logit_bias", lambda r, c, p: r.logit_bias),
    ("min_tokens", lambda r, c, p: r.min_tokens),
    ("logits_processors", lambda r, c, p: r.logits_processors),
    ("thinking_budget", lambda r, c, p: r.thinking_budget),
    # Prompt logprobs need the logits of every prompt position, which only prefill produces.
    ("prompt_logprobs", lambda r, c, p: p and r.prompt_logprobs),
    ("logprobs_exceed_device", lambda r, c, p: _logprobs_exceed(r, c)),
    ("top_k_exceeds_device", lambda r, c, p: _top_k_exceeds(r, c)),
    ("penalties_unsupported", lambda r, c, p: r.penalties and not c.penalties),
)

REASONS: tuple[str, ...] = (
    "mode_off",
    "always_compat",
    "phase_not_enabled",
    "verify_sampled",
    "mixed",
    *(code for code, _ in _ROW_CHECKS),
    "device",
    "verify",
)
"""Every reason code ``choose_sampling_path`` can return (``"device"`` and ``"verify"`` on the
device path: a plain step, a verify step of speculative decoding)."""


def choose_sampling_path(
    requests: Sequence[RowSampling],
    *,
    mode: DeviceSamplingMode | None,
    prefill: bool,
    caps: DeviceSamplingCaps,
    always_compat: bool,
    verify: bool = False,
    mixed: bool = False,
) -> SamplingDecision:
    """Device sampling only when the operator enabled it for this step's phase (``prefill``:
    a prefill step, else a decode step) and every request uses only what the device does
    (greedy/temperature, top-k up to ``caps.max_top_k``, top-p, seed, penalties if declared,
    logprobs up to ``caps.max_logprobs``).

    A ``verify`` step (speculative decoding, a decode step whose drafts the batch can use) is
    verified on the device only when every row is greedy: the device returns its argmax after
    each position and the host keeps the matching drafts (``vllm_tt_sampling.acceptance``).
    One sampled row sends the step to vLLM's rejection sampler on the host
    (``"verify_sampled"``), which needs every position's logits. A ``mixed`` step (decode rows
    and a prompt chunk in one program) is sampled on the host (``"mixed"``)."""
    if not isinstance(prefill, bool):
        raise TypeError(f"prefill={prefill!r} must be a bool: True for a prefill step, False for a decode one.")
    if mode is None:
        return SamplingDecision(SamplingPath.HOST, "mode_off")
    if always_compat:
        return SamplingDecision(SamplingPath.HOST, "always_compat")
    if mode is DeviceSamplingMode.DECODE_ONLY and prefill:
        return SamplingDecision(SamplingPath.HOST, "phase_not_enabled")
    if mixed:  # a mixed step returns logits (model contract: MIXED_KWARGS)
        return SamplingDecision(SamplingPath.HOST, "mixed")
    if verify and not all(row.greedy for row in requests):
        return SamplingDecision(SamplingPath.HOST, "verify_sampled")
    for code, breaks in _ROW_CHECKS:
        if any(breaks(row, caps, prefill) for row in requests):
            return SamplingDecision(SamplingPath.HOST, code)
    return SamplingDecision(SamplingPath.DEVICE, "verify" if verify else "device")


_DRAFT_BLOCKERS: tuple[tuple[str, Callable[[RowSampling], bool]], ...] = (
    ("logprobs", lambda r: r.logprobs is not None or r.logprob_token_ids),
    ("penalties", lambda r: r.penalties),
    ("structured_output", lambda r: r.structured_output),
    ("logits_processors", lambda r: r.logits_processors or r.min_tokens or r.logit_bias or r.min_p
     or r.allowed_token_ids or r.bad_words or r.thinking_budget),
)
"""What keeps a verify step from using drafts: per-token state (logprobs, histories, grammars,
processors) the verify path does not carry. Seeded sampled rows take drafts: they keep their
counter-stream draws (``vllm_tt_sampling.host.speculative``)."""


def drafts_blocked_by(requests: Sequence[RowSampling]) -> str | None:
    """Why this verify step must run without its drafts (one token per row, as a plain decode
    step would give), or None when they can be verified: greedy and plain temperature/top-k/top-p
    rows, seeded or not."""
    for code, blocks in _DRAFT_BLOCKERS:
        if any(blocks(row) for row in requests):
            return code
    return None


def blocks_blocked_by(requests: Sequence[RowSampling]) -> str | None:
    """Why this decode step must not commit blocks (adaptive block output: the model picks each
    row's tokens greedily inside its decode step), or None when every row is greedy and asks for
    nothing a verify step does not carry (``drafts_blocked_by``)."""
    if not all(row.greedy for row in requests):
        return "sampled"
    return drafts_blocked_by(requests)
