"""``sample_tokens``: host reference of what a TT device does inside its sampling program.

Order per row: penalties, then greedy argmax (temperature 0) or temperature, top-k (at most
``max_top_k`` candidates, as on device), top-p within those candidates, and one uniform draw by
inverse CDF (``draw.inverse_cdf_draw``, shared with the host sampler's counter stream). Seeded
rows take their uniform from (seed, position) alone (see ``rng``); unseeded rows from a torch
generator, so they vary from call to call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_tt_sampling.device.draw import inverse_cdf_draw
from vllm_tt_sampling.device.penalties import penalise_rows
from vllm_tt_sampling.device.rng import seeded_uniform
from vllm_tt_sampling.params import DEVICE_TOP_K, TTSamplingParams

_GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class DeviceSample:
    tokens: torch.Tensor
    """``[B]`` int64 sampled token ids."""
    logprobs: torch.Tensor | None
    """``[B]`` float32 log-probability of each sampled token, or None when no row asked; rows
    without ``enable_log_probs`` hold NaN.

    It is the log-softmax of the model's logits before penalties, temperature, top-k and top-p:
    vLLM's default ``raw_logprobs``, so a request's logprobs do not depend on whether its batch
    sampled on the device or on the host."""


def sample_tokens(
    logits: torch.Tensor,
    params: TTSamplingParams,
    positions: torch.Tensor,
    prompt_tokens: torch.Tensor | None = None,
    output_tokens: torch.Tensor | None = None,
    *,
    max_top_k: int = DEVICE_TOP_K,
    generator: torch.Generator | None = None,
) -> DeviceSample:
    """Sample one token per row of ``logits [B, V]``; the caller's tensor is not modified.

    ``positions [B]``: absolute position of each row's last input token (decode ``start_pos``,
    prefill ``prompt_len - 1``); seeded draws are keyed by it. ``prompt_tokens [B, Lp]`` and
    ``output_tokens [B, Lo]`` are histories padded with -1, used only for penalties. A top-k
    below 1 or above ``max_top_k`` becomes ``max_top_k``, as tt-metal does. ``generator``
    feeds unseeded rows (torch's global generator when None).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}.")
    rows, vocab_size = logits.shape
    if len(params) != rows:
        raise ValueError(f"params has {len(params)} rows but logits has {rows}.")
    positions = torch.as_tensor(positions).reshape(-1)
    if positions.numel() != rows:
        raise ValueError(f"positions has {positions.numel()} entries but logits has {rows} rows.")
    if max_top_k < 1:
        raise ValueError(f"max_top_k={max_top_k} must be at least 1.")

    scores = penalise_rows(logits.detach().to(torch.float32), params, prompt_tokens, output_tokens)
    tokens = scores.argmax(dim=-1)
    stochastic = [i for i, t in enumerate(params.temperature) if t >= _GREEDY_EPS]
    if stochastic:
        index = torch.tensor(stochastic, dtype=torch.int64)
        uniforms = _uniforms(params, positions, stochastic, generator)
        temperature = torch.tensor([params.temperature[i] for i in stochastic], dtype=torch.float32)
        top_k = torch.tensor([params.top_k[i] for i in stochastic], dtype=torch.int64)
        cap = min(max_top_k, vocab_size)
        tokens[index] = inverse_cdf_draw(
            scores[index] / temperature.unsqueeze(1),
            top_k=torch.where(top_k < 1, cap, top_k).clamp(max=cap),
            top_p=torch.tensor([params.top_p[i] for i in stochastic], dtype=torch.float32),
            uniforms=uniforms,
        )

    logprobs = None
    if any(params.enable_log_probs):
        # Only rows that asked pay for the log-softmax; the others hold NaN. Raw logits, as
        # vLLM's default logprobs_mode, so a request's logprobs do not depend on the path.
        asked = torch.tensor(params.enable_log_probs, dtype=torch.bool)
        logprobs = torch.full((rows,), float("nan"), dtype=torch.float32)
        chosen = logits.detach()[asked].to(torch.float32).log_softmax(dim=-1)
        logprobs[asked] = chosen.gather(1, tokens[asked].unsqueeze(1)).squeeze(1)
    return DeviceSample(tokens=tokens, logprobs=logprobs)


def _uniforms(
    params: TTSamplingParams,
    positions: torch.Tensor,
    rows: list[int],
    generator: torch.Generator | None,
) -> torch.Tensor:
    unseeded = [i for i in rows if params.seed[i] is None]
    fresh = iter(torch.rand(len(unseeded), generator=generator, dtype=torch.float64).tolist())
    values = []
    for i in rows:
        seed = params.seed[i]
        values.append(next(fresh) if seed is None else seeded_uniform(seed, int(positions[i])))
    return torch.tensor(values, dtype=torch.float64)
