"""Adaptive block output (``--additional-config.tt.block_tokens``): the model speculates inside
its decode step and commits up to a block of tokens per row (model contract: ``BLOCK_KWARG``).

Which steps are block steps is decided per decode step: one whose rows are all greedy and ask
for nothing a verify step does not carry (``vllm_tt_sampling.decision.blocks_blocked_by``);
any other decode step is a plain one (one token per row, sampled as usual). Each row's block is
capped by what it may still produce (``max_tokens``, the model length), so no KV is written
for tokens vLLM would trim; a stop token, EOS or stop string inside a block is vLLM's to cut
(its scheduler trims the tokens after a stop, its detokenizer the text). The scheduler reserves
the block's KV slots and counts the block's KV as computed (``vllm_tt_scheduler.block_output``).
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.logger import init_logger
from vllm_tt_sampling.decision import RowSampling, blocks_blocked_by

from vllm_tt_platform.runner.step import StepPlan

logger = init_logger("vllm." + __name__)


class BlockOutput:
    """The runner's block-output steps: which decode steps take blocks, each row's limit, and
    a count of what they committed (summarised at close)."""

    def __init__(self, block_tokens: int, max_model_len: int) -> None:
        self.block_tokens = block_tokens
        self.max_model_len = max_model_len
        self.steps = 0
        self.rows = 0
        self.tokens = 0
        self.plain_steps = 0
        """Decode steps a row kept from blocks (sampled rows, logprobs, penalties, a grammar)."""

    def describe(self, rows_per_lane: int) -> str:
        """For the startup summary: the block size and the block step's shape."""
        return (f"block output up to {self.block_tokens} tokens per row per decode step from the model's own "
                f"drafter (tt.block_tokens; block trace [{rows_per_lane} rows, {self.block_tokens}], greedy "
                f"rows, other steps decode one token)")

    def limits(self, plan: StepPlan, rows: Sequence[RowSampling]) -> dict[str, int] | None:
        """Each row's most tokens to commit this step, or None for a plain decode step."""
        if blocks_blocked_by(rows) is not None:
            self.plain_steps += 1
            return None
        limits = {}
        for r in plan.rows:
            state = r.state
            max_tokens = state.sampling_params.max_tokens
            left = self.max_model_len - state.num_tokens
            if max_tokens is not None:
                left = min(left, max_tokens - len(state.output_token_ids))
            limits[state.req_id] = max(1, min(self.block_tokens, left))
        return limits

    def committed(self, tokens: Sequence[Sequence[int]]) -> None:
        self.steps += 1
        self.rows += len(tokens)
        self.tokens += sum(len(t) for t in tokens)

    def close(self) -> None:
        """Say once how long the blocks were (the acceptance of the model's own drafter)."""
        if self.steps or self.plain_steps:
            mean = self.tokens / self.rows if self.rows else 0.0
            logger.info("TT block output: %d block steps committed %d tokens over %d rows (%.2f tokens per row "
                        "and step, at most %d); %d decode steps without blocks.", self.steps, self.tokens,
                        self.rows, mean, self.block_tokens, self.plain_steps)
