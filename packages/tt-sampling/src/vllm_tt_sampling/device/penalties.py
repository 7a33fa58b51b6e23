"""Presence / frequency / repetition penalties from -1-padded token histories.

The device receives prompt and output histories as dense tensors padded with -1; the semantics
are vLLM's (OpenAI's): repetition over prompt and output, frequency and presence over the output.
Only the history's tokens change, so the work is gather/scatter over histories, not the vocab.
"""

from __future__ import annotations

import torch

from vllm_tt_sampling.params import TTSamplingParams

PAD_TOKEN = -1


def _history(history: torch.Tensor | None, rows: int, vocab_size: int) -> torch.Tensor:
    """``[rows, L]`` int64 with padding mapped to ``vocab_size`` (a spare column)."""
    if history is None or history.numel() == 0:
        return torch.empty((rows, 0), dtype=torch.int64)
    if history.dim() != 2 or history.shape[0] != rows:
        raise ValueError(
            f"token history has shape {tuple(history.shape)}; expected [{rows}, length] padded with -1."
        )
    tokens = history.to(torch.int64)
    if bool(((tokens < PAD_TOKEN) | (tokens >= vocab_size)).any()):
        raise ValueError(f"token history holds ids outside [0, {vocab_size}) other than the -1 padding.")
    return torch.where(tokens == PAD_TOKEN, vocab_size, tokens)


def apply_penalties(
    wide: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
    prompt_tokens: torch.Tensor | None,
    output_tokens: torch.Tensor | None,
) -> None:
    """Penalise float32 ``wide [B, V + 1]`` in place; column V is scratch for padding.

    Repetition multiplies positive logits by ``1 / penalty`` and negative ones by ``penalty``
    for every token seen in the prompt or output; a repetition penalty of 0 counts as 1
    (tt-metal does the same). Frequency subtracts ``penalty * count`` and presence ``penalty``
    for tokens seen in the output. The float operations are vLLM's, in vLLM's order, so the
    result is bit-identical to vLLM's ``apply_all_penalties`` (the host path).
    """
    rows, vocab_size = wide.shape[0], wide.shape[1] - 1
    prompt = _history(prompt_tokens, rows, vocab_size)
    output = _history(output_tokens, rows, vocab_size)
    seen = torch.cat((prompt, output), dim=1)
    # Duplicate indices write identical values: each is computed from the same pre-penalty logit.
    repetition = torch.where(repetition == 0, 1.0, repetition).unsqueeze(1)
    before = wide.gather(1, seen)
    wide.scatter_(1, seen, before * torch.where(before > 0, 1.0 / repetition, repetition))
    counts = torch.zeros(wide.shape, dtype=torch.int64)
    counts.scatter_add_(1, output, torch.ones_like(output))
    seen_counts = counts.gather(1, output)
    after_repetition = wide.gather(1, output)
    penalised = after_repetition - frequency.unsqueeze(1) * seen_counts
    wide.scatter_(1, output, penalised - presence.unsqueeze(1) * (seen_counts > 0))


def penalise_rows(
    scores: torch.Tensor,
    params: TTSamplingParams,
    prompt_tokens: torch.Tensor | None,
    output_tokens: torch.Tensor | None,
) -> torch.Tensor:
    """``scores [B, V]`` with each row's penalties applied; a new tensor if any row has
    penalties (``scores`` itself is never written), else ``scores``."""
    vocab_size = scores.shape[1]
    triples = zip(params.presence_penalty, params.frequency_penalty, params.repetition_penalty, strict=True)
    penalised = [i for i, (p, f, r) in enumerate(triples) if p != 0.0 or f != 0.0 or r not in (0.0, 1.0)]
    if not penalised:
        return scores
    index = torch.tensor(penalised, dtype=torch.int64)
    # One spare column absorbs the -1 padding of token histories.
    wide = torch.zeros((len(penalised), vocab_size + 1), dtype=torch.float32)
    wide[:, :vocab_size] = scores[index]
    apply_penalties(
        wide,
        presence=torch.tensor([params.presence_penalty[i] for i in penalised]),
        frequency=torch.tensor([params.frequency_penalty[i] for i in penalised]),
        repetition=torch.tensor([params.repetition_penalty[i] for i in penalised]),
        prompt_tokens=None if prompt_tokens is None else prompt_tokens[index],
        output_tokens=None if output_tokens is None else output_tokens[index],
    )
    out = scores.clone()
    out[index] = wide[:, :vocab_size]
    return out
