"""Fixed program shapes: prefill buckets, the trace key of each shape, and the errors raised
when a call does not fit them.

A traced device program has one input shape. Prefill chunks are padded up to a bucket (the
tt-metal rule: 128, 1024, then powers of two) and decode always runs the full batch; warmup
captures one trace per shape, and serving any other shape is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_BUCKETS: tuple[int, ...] = (128, 1024, 2048, 4096)
"""Prefill lengths host models run; a longer chunk is an error (the runner chunks to these)."""


MAX_VERIFY_TOKENS = 8
"""Longest verify trace a host model captures (``1 + K``: up to K=7 drafts per row), declared
as ``max_verify_tokens``; tt-metal models size theirs to the decode trace's L1 room."""


MAX_BLOCK_TOKENS = 8
"""Longest block a self-drafting host model commits per row and decode step (adaptive block
output), declared as ``max_block_tokens``."""


MIXED_SHAPES: tuple[tuple[int, int], ...] = ((32, 32), (32, 128))
"""The ``(decode rows, chunk tokens)`` programs a host decoder declares for mixed steps
(``mixed_shapes``): up to 32 live decode rows beside a chunk of up to 32 or 128 tokens."""


class HostModelInputError(ValueError):
    """A forward call's inputs do not fit the shapes the model was built for."""


class PrefillTooLongError(HostModelInputError):
    """A prefill chunk is longer than the largest bucket; the runner must chunk it."""


def prefill_bucket(length: int, buckets: tuple[int, ...] = PREFILL_BUCKETS) -> int:
    """The padded length tt-metal uses for a chunk of ``length`` tokens."""
    if length < 1:
        raise HostModelInputError(f"a prefill chunk must hold at least one token, got length {length}")
    padded = 128 if length <= 128 else 1024 if length <= 1024 else 1 << (length - 1).bit_length()
    if padded > buckets[-1]:
        raise PrefillTooLongError(
            f"prefill chunk of {length} tokens is longer than the largest prefill bucket "
            f"{buckets[-1]} (buckets: {list(buckets)}); the runner must chunk prefill to "
            "model_capabilities['prefill_trace_lens']"
        )
    return padded


def buckets_up_to(max_seq_len: int, buckets: tuple[int, ...] = PREFILL_BUCKETS) -> tuple[int, ...]:
    """Every bucket a chunk of at most ``max_seq_len`` tokens can pad to."""
    top = prefill_bucket(min(max_seq_len, buckets[-1]), buckets)
    return tuple(b for b in buckets if b <= top)


@dataclass(frozen=True, order=True)
class TraceKey:
    """One captured program shape on one (sub-)mesh."""

    phase: str
    """``"prefill"``, ``"decode"``, ``"verify"``, ``"block"``, ``"mixed"`` or ``"pool"``."""
    length: int
    """Padded tokens per row: the bucket for prefill, 1 for decode, ``1 + K`` for verify."""
    batch: int
    """Rows per program: 1 for prefill (rows run one by one), the lane's batch for decode."""
    device_sampling: bool
    """Decode programs that end in token selection are separate traces."""

    @classmethod
    def prefill(cls, bucket: int) -> TraceKey:
        return cls("prefill", bucket, 1, False)

    @classmethod
    def decode(cls, lane_batch: int, device_sampling: bool) -> TraceKey:
        return cls("decode", 1, lane_batch, device_sampling)

    @classmethod
    def pool(cls, batch: int, length: int) -> TraceKey:
        """A pooling program: ``batch`` whole prompts padded to ``length`` (``pool_forward``)."""
        return cls("pool", length, batch, False)

    @classmethod
    def verify(cls, lane_batch: int, width: int, device_sampling: bool = False) -> TraceKey:
        """A verify step of speculative decoding: ``1 + K`` tokens per row, returning every
        position's logits or, ``device_sampling``, its argmax (device-side verification)."""
        return cls("verify", width, lane_batch, device_sampling)

    @classmethod
    def block(cls, lane_batch: int, block_tokens: int) -> TraceKey:
        """A block-output decode step committing up to ``block_tokens`` tokens per row (the
        model drafts and verifies inside it; it ends in token selection)."""
        return cls("block", block_tokens, lane_batch, True)

    @classmethod
    def mixed(cls, decode_rows: int, chunk_tokens: int) -> TraceKey:
        """A mixed step: up to ``decode_rows`` live decode rows and one prompt chunk of up to
        ``chunk_tokens`` tokens in one program (``mixed_forward``)."""
        return cls("mixed", chunk_tokens, decode_rows, False)

    def __str__(self) -> str:
        sampling = "+sampling" if self.device_sampling else ""
        return f"{self.phase}[len={self.length},batch={self.batch}{sampling}]"
