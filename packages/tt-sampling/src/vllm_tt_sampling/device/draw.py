"""``inverse_cdf_draw``: the one top-k/top-p draw both sampling paths use for seeded rows.

The device reference and the host sampler's counter stream call this same function on the same
temperature-scaled scores with the same uniform, so a seeded request picks the same token
whichever path its batch took (bit for bit, not only in distribution).
"""

from __future__ import annotations

import torch


def inverse_cdf_draw(
    scaled: torch.Tensor,
    *,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """One token per row of ``scaled [n, V]`` (logits already divided by temperature).

    Candidates are each row's ``top_k`` best scores (``top_k`` in ``[1, V]``), sorted best
    first; top-p keeps the smallest prefix whose mass reaches ``top_p`` (always the best
    candidate); ``uniforms [n]`` in [0, 1) picks by inverse CDF over what is kept.
    """
    width = int(top_k.max())
    values, candidates = scaled.topk(width, dim=-1)
    columns = torch.arange(width)
    values = values.masked_fill(columns >= top_k.unsqueeze(1), float("-inf"))
    probs = values.softmax(dim=-1, dtype=torch.float64)
    mass_before = probs.cumsum(dim=-1) - probs
    keep = mass_before < top_p.clamp(0.0, 1.0).unsqueeze(1).to(torch.float64)
    keep[:, 0] = True
    probs = probs * keep
    cdf = probs.cumsum(dim=-1)
    target = (uniforms.to(torch.float64) * cdf[:, -1]).unsqueeze(1)
    choice = torch.searchsorted(cdf, target, right=True).squeeze(1)
    last_kept = (probs > 0).sum(dim=-1) - 1
    choice = torch.minimum(choice, last_kept.clamp(min=0))
    return candidates.gather(1, choice.unsqueeze(1)).squeeze(1)
