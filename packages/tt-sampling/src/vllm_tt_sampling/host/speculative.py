"""``DraftVerifier``: vLLM's rejection sampler over the host logits of a verify step.

A verify step (speculative decoding) returns, per row, the logits after its last token and
after each of its drafts. Which drafts are kept, the recovered or bonus token after them, and
for sampled requests the preservation of the target distribution are all vLLM's
``RejectionSampler``; this class only lays the rows out the way it expects (its
``SpecDecodeMetadata``: flattened logits, draft positions then the bonus position per row) and
reads its output back as one token list per row.

Seeded rows of a counter-stream batch (the runner's: ``SeedStream.COUNTER``) are the exception.
vLLM's rejection sampler would draw their acceptance uniforms, recovered and bonus tokens from a
per-request generator, so a seeded row's tokens would depend on which drafts it was given, and
those depend on its neighbours (a neighbour asking for logprobs runs the step without drafts,
KV pressure preempts a row and drops its drafts). Such a row instead draws, at each of its
positions, the token a plain decode step would draw there (``seeded_uniform(seed, position)``,
on the device or the host alike); a draft stands while it equals that draw, and the first
draw that differs ends the row's tokens. For n-gram drafts (no draft probabilities) this is
rejection sampling too: a draft is kept with the target's probability of it, else the token is
drawn from the target without it. Its outputs are exactly those of serving without speculation,
so the same seed gives the same tokens alone, concurrently, with or without drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_tt_sampling.acceptance import accept_greedy
from vllm_tt_sampling.host import rejection_kernels
from vllm_tt_sampling.host.batch import HostSamplingBatch
from vllm_tt_sampling.host.compat import PortableSampler


def spec_decode_metadata(drafts: Sequence[Sequence[int]]) -> SpecDecodeMetadata:
    """vLLM's metadata for rows with ``drafts[i]`` draft tokens each, logits flattened row by
    row (``len(drafts[i]) + 1`` entries: one per draft, then the bonus position)."""
    num_drafts = [len(d) for d in drafts]
    sampled = np.cumsum([n + 1 for n in num_drafts])
    starts = np.concatenate(([0], sampled[:-1]))
    target = [int(start) + j for start, n in zip(starts, num_drafts, strict=True) for j in range(n)]
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
        num_draft_tokens=num_drafts,
        cu_num_draft_tokens=torch.tensor(np.cumsum(num_drafts), dtype=torch.int32),
        cu_num_sampled_tokens=torch.tensor(sampled, dtype=torch.int32),
        target_logits_indices=torch.tensor(target, dtype=torch.int32),
        bonus_logits_indices=torch.tensor(sampled - 1, dtype=torch.int32),
        logits_indices=torch.arange(int(sampled[-1]), dtype=torch.int32),
    )


class DraftVerifier:
    def __init__(self, batch: HostSamplingBatch, logprobs_mode: str = "raw_logprobs") -> None:
        rejection_kernels.register()
        self.batch = batch
        self._rejection = RejectionSampler(PortableSampler(logprobs_mode))  # type: ignore[arg-type]

    def verify(self, logits: torch.Tensor, slots: Sequence[int], drafts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Tokens of each row: its accepted drafts, then the target's own token after them.

        ``logits [n, 1 + K, V]``: row ``i`` (slot ``slots[i]``) holds the logits after its last
        token at ``[i, 0]`` and after draft ``j`` at ``[i, j + 1]``; ``drafts[i]`` has at most
        ``K`` real tokens (no placeholders)."""
        if logits.dim() != 3 or logits.shape[0] != len(slots) or len(drafts) != len(slots):
            raise ValueError(
                f"logits {tuple(logits.shape)} must be [rows, 1 + K, vocab] for {len(slots)} slots "
                f"and {len(drafts)} draft lists"
            )
        if any(len(d) >= logits.shape[1] for d in drafts):
            raise ValueError(f"a row has more drafts than the verify step's {logits.shape[1] - 1} positions")
        tokens: list[list[int]] = [[] for _ in slots]
        rejection = []
        for i, (slot, row_drafts) in enumerate(zip(slots, drafts, strict=True)):
            if self.batch.counter_seeded(slot):
                tokens[i] = self._counter_row(logits[i], slot, row_drafts)
            else:
                rejection.append(i)
        if rejection:
            rows = self._rejection_rows(logits, slots, drafts, rejection)
            for i, row_tokens in zip(rejection, rows, strict=True):
                tokens[i] = row_tokens
        return tokens

    def _rejection_rows(self, logits: torch.Tensor, slots: Sequence[int], drafts: Sequence[Sequence[int]],
                        rows: list[int]) -> list[list[int]]:
        """vLLM's rejection sampler over ``rows`` (indices into the verify call)."""
        row_drafts = [drafts[i] for i in rows]
        flat = torch.cat([logits[i, : len(drafts[i]) + 1] for i in rows]).to(torch.float32)
        metadata = self.batch.metadata([slots[i] for i in rows])
        out = self._rejection(spec_decode_metadata(row_drafts), None, flat, metadata)
        tokens, _ = RejectionSampler.parse_output(out.sampled_token_ids, self.batch.vocab_size)
        return tokens

    def _counter_row(self, logits: torch.Tensor, slot: int, drafts: Sequence[int]) -> list[int]:
        """A counter-seeded row: its drafts while they equal its own draws, then the first draw
        that differs (or the draw after the last draft); see the module docstring. The draws
        play the target's tokens in greedy acceptance (one rule, ``accept_greedy``)."""
        draws = [self.batch.counter_draw(logits[ahead], slot, ahead) for ahead in range(len(drafts) + 1)]
        return accept_greedy([draws], [drafts])[0]
