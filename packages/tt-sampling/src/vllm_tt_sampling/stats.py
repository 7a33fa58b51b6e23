"""``SamplingStats``: how often batches sampled on device, and why the others did not.

A silent fallback to host sampling costs a full logits read-back per step; counting decisions by
reason lets the runner show it in its step trace and logs instead of leaving users to guess.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_tt_sampling.decision import SamplingDecision


@dataclass
class SamplingStats:
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(path value, reason code) -> number of batches."""

    def record(self, decision: SamplingDecision) -> None:
        self.counts[(decision.path.value, decision.reason)] += 1

    def count(self, path: str | None = None, reason: str | None = None) -> int:
        """Batches matching ``path`` ("device"/"host") and/or ``reason``; all if both None."""
        return sum(
            n
            for (p, r), n in self.counts.items()
            if (path is None or p == path) and (reason is None or r == reason)
        )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        """Flat ``{"device": n, "device:verify": v, "host:min_p": m, ...}``, sorted, for JSON
        step traces."""
        flat = {
            (path if reason == "device" else f"{path}:{reason}"): n for (path, reason), n in self.counts.items()
        }
        return dict(sorted(flat.items()))

    def summary(self) -> str:
        """One line for logs: ``device=120 host=3 (logit_bias=1, min_p=2)``; verify steps of
        speculative decoding verified on the device are named: ``device=120 (verify=40) ...``."""
        host = {r: n for (p, r), n in self.counts.items() if p == "host"}
        line = f"device={self.count('device')}"
        if verified := self.count("device", "verify"):
            line += f" (verify={verified})"
        line += f" host={sum(host.values())}"
        if host:
            line += " (" + ", ".join(f"{r}={n}" for r, n in sorted(host.items())) + ")"
        return line

    def reset(self) -> None:
        self.counts.clear()
