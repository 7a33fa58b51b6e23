"""``HostSamplingBatch``: the model runner's host sampling path, on vLLM's own ``Sampler``.

The runner keeps each request in a fixed slot for its whole life; this class keeps, per slot,
what vLLM's persistent input batch keeps per index (params, histories, generator, logits
processor state), and samples any subset of slots in one call.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np
import torch
from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.logits_processor import LogitsProcessor, build_logitsprocs
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_tt_sampling.device.rng import seeded_uniform
from vllm_tt_sampling.host.compat import PortableSampler
from vllm_tt_sampling.host.grammar import apply_grammar_bitmask
from vllm_tt_sampling.host.metadata import build_metadata
from vllm_tt_sampling.host.processors import SlotLogitsProcessors
from vllm_tt_sampling.host.requests import SlotRequest


class SeedStream(enum.Enum):
    """Where a seeded request's random draws come from on the host path."""

    GENERATOR = "generator"
    """vLLM's per-request ``torch.Generator``, advanced once per sampled token: vLLM's own
    semantics, but unrelated to the device's draws."""
    COUNTER = "counter"
    """The device's counter stream: the uniform for a token is ``seeded_uniform(seed,
    position)`` and the draw is ``device.draw.inverse_cdf_draw``, so a seeded request gets the
    same tokens whether its batch sampled on the device or fell back to the host."""


class HostSamplingBatch:
    def __init__(
        self,
        num_slots: int,
        vocab_size: int,
        vllm_config: VllmConfig,
        logits_processors: Sequence[str | type[LogitsProcessor]] | None = None,
        *,
        seed_stream: SeedStream = SeedStream.GENERATOR,
    ) -> None:
        """``logits_processors``: custom processor classes or ``module:Class`` names; None takes
        ``model_config.logits_processors``, as vLLM's GPU runner does. ``seed_stream``: see
        ``SeedStream``; a runner that also samples on the device wants ``COUNTER``."""
        if num_slots < 1 or vocab_size < 1:
            raise ValueError(f"num_slots={num_slots} and vocab_size={vocab_size} must be >= 1.")
        max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        if num_slots > max_num_seqs:
            raise ValueError(
                f"num_slots={num_slots} exceeds scheduler max_num_seqs={max_num_seqs}: vLLM's "
                "logits processors size their per-request buffers by max_num_seqs."
            )
        model_config = vllm_config.model_config
        if logits_processors is None and model_config is not None:
            logits_processors = model_config.logits_processors
        processors = build_logitsprocs(
            vllm_config,
            torch.device("cpu"),
            is_pin_memory=False,
            is_pooling_model=False,
            custom_logitsprocs=tuple(logits_processors or ()),
        )
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.seed_stream = seed_stream
        self._sampler = PortableSampler(
            model_config.logprobs_mode if model_config is not None else "raw_logprobs"
        )
        self._slots: list[SlotRequest | None] = [None] * num_slots
        self._slot_of: dict[str, int] = {}
        self._processors = SlotLogitsProcessors(processors, num_slots, vocab_size,
                                                getattr(vllm_config, "reasoning_config", None))
        self._version = 0
        self._cached: tuple[tuple[tuple[int, ...], int], SamplingMetadata] | None = None

    def add_request(
        self,
        slot: int,
        req_id: str,
        params: SamplingParams,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        generator: torch.Generator | None,
    ) -> None:
        """Place a request in a free slot. ``output_token_ids`` is the runner's live list."""
        self._check_slot(slot)
        if (holder := self._slots[slot]) is not None:
            raise ValueError(
                f"slot {slot} holds request {holder.req_id!r}; remove it before adding {req_id!r}."
            )
        if req_id in self._slot_of:
            raise ValueError(f"request {req_id!r} already sits in slot {self._slot_of[req_id]}.")
        if self.seed_stream is SeedStream.COUNTER:
            generator = None  # seeded draws are recomputed from (seed, position)
        request = SlotRequest.create(
            req_id, params, prompt_token_ids, output_token_ids, generator, self.vocab_size
        )
        self._slots[slot] = request
        self._slot_of[req_id] = slot
        self._processors.add(slot, params, prompt_token_ids, output_token_ids)
        self._version += 1

    def remove_request(self, slot: int) -> None:
        request = self._require(slot)
        self._slots[slot] = None
        del self._slot_of[request.req_id]
        self._processors.remove(slot)
        self._version += 1

    def slot_of(self, req_id: str) -> int:
        if req_id not in self._slot_of:
            raise KeyError(f"request {req_id!r} is not in the host sampling batch.")
        return self._slot_of[req_id]

    def sample(
        self,
        logits: torch.Tensor,
        slots: Sequence[int],
        grammar_bitmask: np.ndarray | None = None,
        grammar_req_slots: Sequence[int] = (),
        *,
        grammar_req_ids: Sequence[str] = (),
        positions: Sequence[int] | None = None,
    ) -> SamplerOutput:
        """Sample row i of ``logits [n, V]`` for ``slots[i]``; the caller's tensor is untouched.

        ``grammar_bitmask`` is ``GrammarOutput.grammar_bitmask``; name the slot of each of its
        rows with ``grammar_req_slots`` or pass ``GrammarOutput.structured_output_request_ids``
        as ``grammar_req_ids``. Bitmask rows of requests not in ``slots`` are ignored.

        ``positions``: absolute position of each row's last input token, the counter of seeded
        draws (pass what the device would get); by default prompt + output length - 1.
        """
        slots = list(slots)
        requests = self._check_call(logits, slots)
        if positions is not None and len(positions) != len(slots):
            raise ValueError(f"positions has {len(positions)} entries for {len(slots)} slots.")
        if not slots:
            return SamplerOutput(
                sampled_token_ids=torch.empty((0, 1), dtype=torch.int32), logprobs_tensors=None
            )
        logits = logits.to(torch.float32, copy=True)
        if grammar_bitmask is not None:
            row_of_slot = {slot: row for row, slot in enumerate(slots)}
            mask_slots = self._grammar_slots(grammar_req_slots, grammar_req_ids)
            apply_grammar_bitmask(logits, grammar_bitmask, [row_of_slot.get(s) for s in mask_slots])
        metadata = self._metadata(slots, requests)
        uniforms = self._counter_uniforms(requests, positions)
        return self._sampler.sample_counter(logits, metadata, uniforms)

    def counter_seeded(self, slot: int) -> bool:
        """The slot's request draws from the counter stream: seeded, not greedy, and this batch
        uses ``SeedStream.COUNTER``."""
        request = self._require(slot)
        counter = self.seed_stream is SeedStream.COUNTER
        return counter and request.params.seed is not None and not request.greedy

    def counter_draw(self, logits: torch.Tensor, slot: int, ahead: int) -> int:
        """The token a counter-seeded slot draws ``ahead`` positions past its last token, from
        ``logits [V]`` (the distribution after those ``ahead`` tokens): ``seeded_uniform(seed,
        last position + ahead)``, what ``sample`` gives once the ``ahead`` tokens are the slot's
        (for requests without penalties or logits processors, which would see the history)."""
        if not self.counter_seeded(slot):
            raise ValueError(f"slot {slot} does not draw from the counter stream (seeded sampling, "
                             "SeedStream.COUNTER).")
        request = self._require(slot)
        last = len(request.prompt_token_ids) + len(request.output_token_ids) - 1
        return int(self.sample(logits.view(1, -1), [slot], positions=[last + ahead]).sampled_token_ids[0, 0])

    def metadata(self, slots: Sequence[int]) -> SamplingMetadata:
        """vLLM's ``SamplingMetadata`` of ``slots`` (row ``i`` = ``slots[i]``), as ``sample``
        uses it; for vLLM's rejection sampler on verify steps."""
        slots = list(slots)
        return self._metadata(slots, [self._require(slot) for slot in slots])

    def _metadata(self, slots: list[int], requests: list[SlotRequest]) -> SamplingMetadata:
        logitsprocs = self._processors.step(slots)
        key = (tuple(slots), self._version)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, build_metadata(requests, self.vocab_size, logitsprocs,
                                                self._processors.thinking_budget))
        return self._cached[1]

    def _counter_uniforms(
        self, requests: list[SlotRequest], positions: Sequence[int] | None
    ) -> dict[int, float]:
        """Row -> uniform of each seeded stochastic row, under the counter stream."""
        if self.seed_stream is not SeedStream.COUNTER:
            return {}
        uniforms = {}
        for row, request in enumerate(requests):
            seed = request.params.seed
            if seed is None or request.greedy:
                continue
            if positions is None:
                position = len(request.prompt_token_ids) + len(request.output_token_ids) - 1
            else:
                position = int(positions[row])
            uniforms[row] = seeded_uniform(seed, position)
        return uniforms

    def _grammar_slots(self, req_slots: Sequence[int], req_ids: Sequence[str]) -> list[int]:
        if req_slots and req_ids:
            raise ValueError("pass grammar_req_slots or grammar_req_ids, not both.")
        if req_ids:
            return [self.slot_of(r) for r in req_ids]
        return list(req_slots)

    def _check_call(self, logits: torch.Tensor, slots: list[int]) -> list[SlotRequest]:
        if logits.dim() != 2 or logits.shape[0] != len(slots):
            raise ValueError(
                f"logits has shape {tuple(logits.shape)}; expected [{len(slots)}, "
                f"{self.vocab_size}] (one row per slot)."
            )
        if logits.shape[1] != self.vocab_size:
            raise ValueError(
                f"logits has {logits.shape[1]} columns; this batch samples a vocabulary of {self.vocab_size}."
            )
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots {slots} name a slot twice.")
        return [self._require(slot) for slot in slots]

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot={slot} is outside 0..{self.num_slots - 1}.")

    def _require(self, slot: int) -> SlotRequest:
        self._check_slot(slot)
        request = self._slots[slot]
        if request is None:
            raise ValueError(f"slot {slot} holds no request.")
        return request
