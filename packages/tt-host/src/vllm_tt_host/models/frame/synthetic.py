"""``SyntheticLM``: deterministic stand-in logits for timing runs that skip the model math.

With ``host_skip_math`` a host model returns logits from a fixed pseudo-random table, indexed by
a hash of the input token and its position. Tokens then depend on exactly what a real model's
next token depends on at a step (the input and where it sits), so a stale or misplaced input
still changes the output, but a step costs microseconds, so emulated large models can be timed.
"""

from __future__ import annotations

import torch

_TABLE_VALUES = 1 << 21
"""Upper bound on table entries (8 MiB of float32)."""


class SyntheticLM:
    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        rows = max(16, min(512, _TABLE_VALUES // vocab_size))
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(rows, vocab_size, generator=generator) * 4.0
        self.argmax = self.table.argmax(dim=-1)

    def _rows(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        key = tokens.long() * 2654435761 + positions.long().clamp(min=0) * 40503 + 12345
        return (key ^ (key >> 13)) % self.table.shape[0]

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[B, V]`` logits after ``tokens [B]`` at ``positions [B]``."""
        return self.table[self._rows(tokens, positions)]

    def greedy(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The argmax of ``logits(tokens, positions)`` without building the logits: a greedy
        batch costs the emulated device (and the GIL it shares with the host) next to nothing."""
        return self.argmax[self._rows(tokens, positions)]
