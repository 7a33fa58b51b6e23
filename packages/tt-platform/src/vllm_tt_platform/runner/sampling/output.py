"""What a step sampled, in the shapes vLLM's scheduler reads: sampled tokens and logprobs of
the rows that produce a token, and prompt logprobs once a prompt is fully computed.

Row order is the runner's output order: producing rows first, so row ``i`` of the
``LogprobsLists`` is the request at ``req_id_to_index == i`` (vLLM slices it by that index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm_tt_sampling.host import HostSamplingBatch
from vllm_tt_sampling.host.logprobs import gather_logprobs

from vllm_tt_platform.runner.model_output import ModelOutput, ModelOutputError
from vllm_tt_platform.runner.step import ScheduledRow

UNKNOWN_RANK = -1
"""Rank reported for a device-sampled token: a device returning only the sampled token's
logprob cannot rank it (the OpenAI API does not expose ranks)."""


@dataclass(frozen=True)
class SampledRows:
    tokens: list[int]
    """One token per producing row, in row order."""
    logprobs: LogprobsLists | None
    """Row ``i`` belongs to ``tokens[i]``; None when no producing row asked for logprobs."""


def positions(rows: Sequence[ScheduledRow]) -> list[int]:
    """Absolute position of each row's last input token: the counter of seeded draws, the
    same number the model gets (decode ``start_pos``, prefill ``prompt_len - 1``)."""
    return [r.end - 1 for r in rows]


def from_device(output: ModelOutput, index: torch.Tensor, rows: Sequence[ScheduledRow]) -> SampledRows:
    """Tokens the model sampled, and the sampled tokens' logprobs when a row asked for them
    (the decision sent larger top-n requests to the host)."""
    if output.tokens is None:
        raise ModelOutputError("the model was asked to sample on device but returned no tokens")
    tokens = output.tokens[index]
    if not any(r.state.sampling_params.logprobs is not None for r in rows):
        return SampledRows(tokens.tolist(), None)
    if output.logprobs is None:
        raise ModelOutputError(
            "a request asked for logprobs and the batch sampled on device, but the model returned "
            "no logprobs (it must return (tokens, logprobs) when any row has enable_log_probs)"
        )
    if isinstance(output.logprobs, tuple):
        tensors = _from_top_k(output.logprobs, tokens, index, rows)
    else:
        tensors = LogprobsTensors(
            logprob_token_ids=tokens.to(torch.int32).unsqueeze(1),
            logprobs=output.logprobs.reshape(-1)[index].to(torch.float32).unsqueeze(1),
            selected_token_ranks=torch.full((len(rows),), UNKNOWN_RANK, dtype=torch.int64),
        )
    return SampledRows(tokens.tolist(), tensors.tolists())


def _from_top_k(
    pair: tuple[torch.Tensor, torch.Tensor], tokens: torch.Tensor, index: torch.Tensor, rows: Sequence[ScheduledRow]
) -> LogprobsTensors:
    """tt-metal's top-k form: the sampled token's logprob and rank are read from its place in
    the list, then the top-n the rows asked for follow (vLLM's layout)."""
    top_lp = pair[0].reshape(pair[0].shape[0], -1)[index].to(torch.float32)
    top_ids = pair[1].reshape(pair[1].shape[0], -1)[index].to(torch.int64)
    wanted = max(r.state.sampling_params.logprobs or 0 for r in rows)
    if wanted > top_ids.shape[1]:
        raise ModelOutputError(f"a request asked for {wanted} logprobs, the model returned {top_ids.shape[1]}")
    match = top_ids == tokens.unsqueeze(1)
    if not bool(match.any(dim=1).all()):
        raise ModelOutputError("the model's top-k logprobs do not contain the sampled token (the contract requires it)")
    place = match.int().argmax(dim=1)
    return LogprobsTensors(
        logprob_token_ids=torch.cat((tokens.unsqueeze(1), top_ids[:, :wanted]), dim=1).to(torch.int32),
        logprobs=torch.cat((top_lp.gather(1, place.unsqueeze(1)), top_lp[:, :wanted]), dim=1),
        selected_token_ranks=place + 1,
    )


def from_host(
    sampler: HostSamplingBatch, logits: torch.Tensor, rows: Sequence[ScheduledRow], grammar_output: Any
) -> SampledRows:
    """vLLM's sampler over the rows' slots; seeded rows keyed by their positions."""
    grammar: dict[str, Any] = {}
    if grammar_output is not None:
        grammar = {"grammar_bitmask": grammar_output.grammar_bitmask,
                   "grammar_req_ids": grammar_output.structured_output_request_ids}
    sampled = sampler.sample(logits, [r.state.slot for r in rows], positions=positions(rows), **grammar)
    tokens = sampled.sampled_token_ids[:, 0].tolist()
    tensors = sampled.logprobs_tensors
    return SampledRows(tokens, tensors.tolists() if tensors is not None else None)


@dataclass
class _PromptInProgress:
    prompt: list[int]
    num_logprobs: int
    tensors: LogprobsTensors
    """``[prompt_len - 1, num_logprobs + 1]``: row ``p`` scores prompt token ``p + 1``."""


class PromptLogprobs:
    """Prompt logprobs of the requests that asked, filled chunk by chunk as their prefill runs
    and handed to the scheduler once, with the step that samples their first token (vLLM's
    scheduler rejects them on a step that emits nothing for the request)."""

    def __init__(self, vocab_size: int, logprobs_mode: str = "raw_logprobs") -> None:
        self.vocab_size = vocab_size
        self.raw_scores = logprobs_mode in ("raw_logits", "processed_logits")
        """vLLM's runner scores prompt tokens with logits, not logprobs, in the logits modes."""
        self._pending: dict[str, _PromptInProgress] = {}
        self._done: dict[str, LogprobsTensors] = {}

    def add(self, req_id: str, params: SamplingParams, prompt: list[int]) -> None:
        """Track a new request; nothing to do unless it asked for prompt logprobs."""
        if params.prompt_logprobs is None:
            return
        count = self.vocab_size if params.prompt_logprobs == -1 else params.prompt_logprobs
        tensors = LogprobsTensors.empty_cpu(len(prompt) - 1, count + 1)
        self._pending[req_id] = _PromptInProgress(list(prompt), count, tensors)

    def drop(self, req_id: str) -> None:
        self._pending.pop(req_id, None)
        self._done.pop(req_id, None)

    def wanted(self, rows: Sequence[ScheduledRow]) -> bool:
        """Whether a prefill of ``rows`` must return every position's logits."""
        return any(r.state.req_id in self._pending for r in rows)

    def collect(self, rows: Sequence[ScheduledRow], all_logits: torch.Tensor) -> None:
        """Score this step's chunk of each tracked row from ``all_logits [B, T, V]`` (row ``i``
        right-aligned: its last computed position at ``T - 1``)."""
        width = all_logits.shape[1]
        for i, row in enumerate(rows):
            entry = self._pending.get(row.state.req_id)
            if entry is None:
                continue
            start = row.state.num_computed_tokens
            stop = min(row.end, len(entry.prompt) - 1)
            if stop > start:
                first = width - (row.end - start)
                logits = all_logits[i, first : first + stop - start].to(torch.float32)
                scores = logits if self.raw_scores else logits.log_softmax(dim=-1)
                targets = torch.tensor(entry.prompt[start + 1 : stop + 1], dtype=torch.int64)
                chunk = gather_logprobs(scores, entry.num_logprobs, targets)
                entry.tensors.logprob_token_ids[start:stop] = chunk.logprob_token_ids
                entry.tensors.logprobs[start:stop] = chunk.logprobs
                entry.tensors.selected_token_ranks[start:stop] = chunk.selected_token_ranks
            if row.produces_token:
                self._done[row.state.req_id] = entry.tensors
                del self._pending[row.state.req_id]

    def take_done(self) -> dict[str, LogprobsTensors]:
        """Prompt logprobs completed since the last call (for ``prompt_logprobs_dict``)."""
        done, self._done = self._done, {}
        return done
