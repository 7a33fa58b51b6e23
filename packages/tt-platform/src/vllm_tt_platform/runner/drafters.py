"""Where a speculating runner's drafts come from: one ``Drafter`` per ``--speculative-config``
method, each proposing up to K tokens per row after every step.

``ngram`` is vLLM's own ``NgramProposer`` over each row's tokens, on the host; ``draft_model``
is a drafter checkpoint run on the mesh (``draft_model.DraftModel``); ``mtp`` is the target
checkpoint's MTP module, run by the model on the mesh (``mtp.MtpDrafts``). All return drafts
the target verifies in the same fixed-shape verify steps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
from vllm.config import VllmConfig

from vllm_tt_platform.runner.batch import RequestState


class Drafter(Protocol):
    def propose(self, states: list[RequestState]) -> list[list[int]]:
        """Up to K drafts for each of ``states`` (rows that produced a token last step), in order."""
        ...

    def forget(self, req_ids: Iterable[str]) -> None:
        """Rows that left the batch (finished or preempted): drop what was kept for them."""
        ...

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        """A verify step kept ``accepted`` of the row's ``drafted`` drafts."""
        ...


class PagedDrafter(Drafter, Protocol):
    """A drafter with KV pages of its own on the mesh, one per target block (``draft_model``'s
    drafter checkpoint, ``mtp``'s MTP module): its bytes join the target's KV budget."""

    @property
    def bytes_per_block(self) -> int: ...

    def allocate(self, num_blocks: int, table_width: int, heads_per_device: Callable[[int], int]) -> None:
        """Its pages, once vLLM has planned the target's blocks."""
        ...

    def narrow(self, max_model_len: int, table_width: int) -> None:
        """vLLM shortened ``max_model_len`` to fit the KV cache (``update_max_model_len``)."""
        ...

    def describe(self, num_blocks: int | None = None) -> str:
        """For the startup summary: where it runs and what its KV costs."""
        ...


class DraftBackoff:
    """A row whose drafts keep missing drafts less, so a drafter that costs device time does
    not slow a row it cannot help: after ``PROBE_AFTER`` verify steps in a row that kept none of
    its drafts the row drafts one token (a cheap probe), after ``SKIP_AFTER`` it skips drafting
    for 2, 4, ... up to ``MAX_SKIP`` steps (plain decode steps); one accepted draft brings it
    back to K. (One miss alone changes nothing: at 70 % acceptance 30 % of steps miss.)"""

    PROBE_AFTER = 2
    SKIP_AFTER = 4
    MAX_SKIP = 32

    def __init__(self) -> None:
        self._misses: dict[str, int] = {}
        self._skip: dict[str, int] = {}

    def drafts_for(self, req_id: str, k: int) -> int:
        """How many drafts the row gets this step (0: it decodes plainly)."""
        left = self._skip.get(req_id, 0)
        if left:
            self._skip[req_id] = left - 1
            return 0
        return 1 if self._misses.get(req_id, 0) >= self.PROBE_AFTER else k

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        if accepted or not drafted:
            self._misses.pop(req_id, None)
            return
        misses = self._misses[req_id] = self._misses.get(req_id, 0) + 1
        if misses >= self.SKIP_AFTER:
            self._skip[req_id] = min(2 ** (misses - self.SKIP_AFTER + 1), self.MAX_SKIP)

    def forget(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._misses.pop(req_id, None)
            self._skip.pop(req_id, None)


NUMBA_THREADS = "NUMBA_NUM_THREADS"


def one_numba_thread() -> None:
    """vLLM's ``NgramProposer`` runs its numba kernel on one thread (``min(1, cores // 2)``),
    but numba starts an OpenMP pool of one thread per core, and their spinning after every
    step's proposal starves the runner's own host work: 200 four-token n-gram requests on the
    host backend took 62 s with numba's default pool, 2.3 s with one thread (2 loaded cores).
    numba reads the count once, at import; a count the user set is kept."""
    if "numba" not in sys.modules:
        os.environ.setdefault(NUMBA_THREADS, "1")


class NgramDrafts:
    """vLLM's ``NgramProposer`` over each row's prompt and output tokens."""

    def __init__(self, vllm_config: VllmConfig, num_tokens: int, num_slots: int) -> None:
        one_numba_thread()
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer  # numba JIT: only when used

        self.num_tokens = num_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.proposer = NgramProposer(vllm_config)
        self._token_ids = np.zeros((num_slots, self.max_model_len), dtype=np.int32)
        self._num_tokens = np.zeros(num_slots, dtype=np.int32)

    def propose(self, states: list[RequestState]) -> list[list[int]]:
        sampled: list[list[int]] = [[] for _ in range(self._token_ids.shape[0])]
        for state in states:
            tokens = state.token_ids(min(state.num_tokens, self.max_model_len))
            self._token_ids[state.slot, : len(tokens)] = tokens
            self._num_tokens[state.slot] = len(tokens)
            sampled[state.slot] = [tokens[-1]]
        drafts = self.proposer.propose(self.num_tokens, sampled, self._num_tokens, self._token_ids)
        return [list(drafts[s.slot]) for s in states]

    def forget(self, req_ids: Iterable[str]) -> None:
        """Nothing is kept per row: each proposal reads the row's tokens afresh."""

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        """N-gram drafts cost no device time: every row keeps drafting."""
