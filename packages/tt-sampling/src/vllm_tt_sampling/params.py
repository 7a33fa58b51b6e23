"""``TTSamplingParams``: the per-row sampling parameters sent to a model that samples on device.

The layout duck-types tt-metal's ``SamplingParams``: every field is a list with one entry per
row of the call, padding rows carry neutral values.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_LOGPROBS = -2
"""``num_logprobs`` value for a row that wants no logprobs (0 = the sampled token's only)."""

DEVICE_TOP_K = 32
"""tt-metal's sampler considers at most this many candidates per row (larger k is capped)."""


@dataclass(frozen=True)
class TTSamplingParams:
    temperature: list[float]
    """0.0 means greedy."""
    top_k: list[int]
    top_p: list[float]
    presence_penalty: list[float]
    frequency_penalty: list[float]
    repetition_penalty: list[float]
    seed: list[int | None]
    num_logprobs: list[int]
    enable_log_probs: list[bool]

    def __len__(self) -> int:
        return len(self.temperature)

    @classmethod
    def neutral(cls, rows: int) -> TTSamplingParams:
        """Parameters of padding rows: greedy, no penalties, no logprobs."""
        return cls(
            temperature=[0.0] * rows,
            top_k=[1] * rows,
            top_p=[1.0] * rows,
            presence_penalty=[0.0] * rows,
            frequency_penalty=[0.0] * rows,
            repetition_penalty=[1.0] * rows,
            seed=[None] * rows,
            num_logprobs=[NO_LOGPROBS] * rows,
            enable_log_probs=[False] * rows,
        )

    @property
    def has_penalties(self) -> bool:
        return any(
            p != 0.0 or f != 0.0 or r != 1.0
            for p, f, r in zip(
                self.presence_penalty, self.frequency_penalty, self.repetition_penalty, strict=True
            )
        )
