"""Adaptive block output in the scheduler (``--additional-config.tt.block_tokens``): a decode
step may commit several tokens per row, so vLLM's scheduler must reserve their KV slots and
count their KV as computed.

The model speculates inside its decode step (``vllm_tt_models_registry.contract.BLOCK_KWARG``):
a row scheduled for its one new token comes back with ``n`` tokens, and the model wrote the KV
of the input token and of all of them but the last, as ``n`` plain decode steps would. vLLM's
scheduler already handles ``n`` tokens per row (speculative decoding returns them too): it
appends them one by one and trims at a stop token, ``max_tokens`` or the model length, and it
expects the row's computed tokens to cover every returned token but the last. This module
supplies the two facts vLLM cannot know: ``block - 1`` lookahead slots per row (the most
positions a block step writes beyond the scheduled one) and the ``n - 1`` computed tokens the
step added beyond the scheduled one.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput


def reserve_lookahead(scheduler: Any, block_tokens: int) -> None:
    """Every allocation leaves room for a block: ``block_tokens - 1`` slots past the scheduled
    tokens (vLLM caps them at the model length). A drafter that writes its K drafts' KV (the
    model's own, ``custom_class``) asks for a block of ``1 + K``."""
    scheduler.num_lookahead_tokens = max(scheduler.num_lookahead_tokens, block_tokens - 1)


def count_block_tokens(requests: dict[str, Any], scheduler_output: SchedulerOutput,
                       model_runner_output: ModelRunnerOutput) -> None:
    """Before vLLM reads the step's output: a row that carried no drafts and got ``n > 1``
    tokens (a block) had the KV of ``n - 1`` more positions computed in the step."""
    sampled = model_runner_output.sampled_token_ids
    if not sampled:
        return
    drafted = scheduler_output.scheduled_spec_decode_tokens
    for req_id, index in model_runner_output.req_id_to_index.items():
        extra = len(sampled[index]) - 1
        request = requests.get(req_id)
        if extra > 0 and request is not None and req_id not in drafted:
            request.num_computed_tokens += extra
