"""``to_device_params``: vLLM ``SamplingParams`` rows -> the ``TTSamplingParams`` wire format.

Normalisation follows what tt-metal expects, so the model never sees vLLM's sentinels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm_tt_sampling.params import NO_LOGPROBS, TTSamplingParams

if TYPE_CHECKING:
    from vllm import SamplingParams

_SAMPLING_EPS = 1e-5


def to_device_params(rows: Sequence[SamplingParams | None], vocab_size: int) -> TTSamplingParams:
    """One wire row per entry; ``None`` is a padding row with neutral values.

    - temperature below vLLM's epsilon -> 0.0 (greedy), with top_k 1;
    - top_k <= 0 or >= vocab -> ``vocab_size`` (disabled; the device caps it at its maximum, so
      the decision function keeps such stochastic rows on the host);
    - top_k == 1 -> top_p 0.0 (tt-metal#46827: the device top-32 path with RNG made top_k=1
      non-deterministic);
    - logprobs None -> ``NO_LOGPROBS``, -1 (whole vocabulary) -> ``vocab_size``.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be positive.")
    neutral = TTSamplingParams.neutral(1)
    cols: dict[str, list] = {name: [] for name in _FIELDS}
    for params in rows:
        row = _neutral_row(neutral) if params is None else _row(params, vocab_size)
        for name, value in zip(_FIELDS, row, strict=True):
            cols[name].append(value)
    return TTSamplingParams(**cols)


_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "num_logprobs",
    "enable_log_probs",
)


def _neutral_row(neutral: TTSamplingParams) -> tuple:
    return tuple(getattr(neutral, name)[0] for name in _FIELDS)


def _row(params: SamplingParams, vocab_size: int) -> tuple:
    greedy = params.temperature < _SAMPLING_EPS
    top_k = 1 if greedy else params.top_k
    if top_k <= 0 or top_k >= vocab_size:
        top_k = vocab_size
    top_p = min(max(float(params.top_p), 0.0), 1.0)
    if top_k == 1:
        top_p = 0.0
    if params.logprobs is None:
        num_logprobs = NO_LOGPROBS
    elif params.logprobs < 0:
        num_logprobs = vocab_size
    else:
        num_logprobs = params.logprobs
    return (
        0.0 if greedy else float(params.temperature),
        top_k,
        top_p,
        float(params.presence_penalty),
        float(params.frequency_penalty),
        float(params.repetition_penalty),
        params.seed,
        num_logprobs,
        num_logprobs >= 0,
    )
