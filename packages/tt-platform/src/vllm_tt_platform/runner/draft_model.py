"""``method: draft_model``: a small checkpoint with the target's vocabulary, served through the
same model contract as a second program on the same mesh, proposes K greedy drafts per row.

Its KV cache has pages of its own, one per target block id: a row's drafter KV for position
``p`` lives in the block the target uses for ``p`` (vLLM reserves K lookahead slots per row for
``draft_model``), so the drafter needs no block table of its own and vLLM's block budget covers
both (the budget's bytes per block grow by the drafter's). A token's KV stands while the
drafter has seen the same tokens before it: after each verify step the drafter re-reads only
what differs from its last drafts (the accepted drafts are already in its cache, the target's
next token is not), as one verify-shaped step of at most ``1 + K`` tokens; a new or resumed row
is prefilled. Then ``K - 1`` plain decode steps over the fixed batch finish the drafts. A row
whose drafts keep missing drafts one token, then pauses drafting (``drafters.DraftBackoff``):
the drafter's programs cost device time the row would not win back. All of
it runs on the host's view of the mesh clock like the target's programs (modelled device time
counts the drafter's steps too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm_tt_models_registry.contract import VERIFY_KWARG, TTModel

from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.runner import model_output
from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.drafters import DraftBackoff
from vllm_tt_platform.runner.step import page_table


@dataclass
class SeenTokens:
    """What the drafter's KV holds for a row: the row's first ``confirmed`` tokens, then the
    drafts it fed itself after them (positions ``confirmed..``)."""

    confirmed: int
    drafts: list[int]

    def valid(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the drafter's KV already holds."""
        n = self.confirmed
        for draft, token in zip(self.drafts, tokens[self.confirmed:], strict=False):
            if draft != token:
                break
            n += 1
        return n


@dataclass(frozen=True)
class _Row:
    state: RequestState
    tokens: list[int]
    start: int
    """First position the drafter has no KV for."""
    num_drafts: int


class DraftModel:
    """The drafter checkpoint of ``--speculative-config`` (``model``), built by its family's
    contract class (``TTSetup.drafter``)."""

    def __init__(self, vllm_config: VllmConfig, setup: TTSetup, mesh_device: Any, num_tokens: int) -> None:
        spec = vllm_config.speculative_config
        if spec is None or setup.drafter is None:
            raise ValueError("DraftModel needs --speculative-config method draft_model (TTSetup.drafter)")
        self.draft_config = spec.draft_model_config
        self.hf_config = self.draft_config.hf_text_config
        self.model_cls = cast("type[TTModel]", setup.drafter.load_class())
        if callable(getattr(self.model_cls, "get_kv_cache_spec", None)):
            raise TTUnsupportedFeatureError(
                "--speculative-config model", self.draft_config.model,
                "a full-attention drafter (one KV page per target block)",
                f"use a drafter of a family without its own KV spec ({self.model_cls.__qualname__} declares one)",
            )
        self.caps = setup.drafter.capabilities()
        self.num_tokens = num_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        self.num_slots = setup.topology.decode_rows
        self.model = self.model_cls.initialize_vllm_model(
            self.draft_config.hf_config, mesh_device, setup.topology.decode_rows,
            max_seq_len=self.max_model_len, tt_data_parallel=setup.topology.lanes,
            optimizations=setup.config.optimizations,
        )
        self.kv_spec = FullAttentionSpec(
            block_size=self.block_size, num_kv_heads=self.hf_config.num_key_value_heads,
            head_size=getattr(self.hf_config, "head_dim", None)
            or self.hf_config.hidden_size // self.hf_config.num_attention_heads,
            dtype=cast(torch.dtype, vllm_config.model_config.dtype),
        )
        self._kv: Any = None
        self._table_width = 0
        self._blocks_per_lane = 0
        self._seen: dict[str, SeenTokens] = {}
        self.backoff = DraftBackoff()

    @property
    def num_layers(self) -> int:
        return int(self.hf_config.num_hidden_layers)

    @property
    def bytes_per_block(self) -> int:
        """The drafter's KV bytes per target block (every drafter layer's page)."""
        return self.kv_spec.page_size_bytes * self.num_layers

    def allocate(self, num_blocks: int, table_width: int, heads_per_device: Callable[[int], int]) -> None:
        """One page per target block, through the drafter's ``allocate_kv_cache``."""
        shape = (num_blocks, heads_per_device(self.kv_spec.num_kv_heads), self.block_size, self.kv_spec.head_size)
        self._kv = self.model.allocate_kv_cache(shape, self.kv_spec.dtype, self.num_layers)
        self._table_width = table_width
        self._blocks_per_lane = num_blocks

    def narrow(self, max_model_len: int, table_width: int) -> None:
        """vLLM shortened ``max_model_len`` to fit the KV cache (``update_max_model_len``)."""
        self.max_model_len = max_model_len
        self._table_width = table_width

    def describe(self, num_blocks: int | None = None) -> str:
        kv = f"{self.bytes_per_block / 1024:.1f} KiB/block"
        if num_blocks is not None:
            kv += f" = {self.bytes_per_block * num_blocks / 2**20:.1f} MiB/lane"
        return (f"drafter {self.draft_config.model} ({self.num_layers}-layer {type(self.model).__qualname__}) "
                f"as a second program on the same mesh, KV {kv}")

    def forget(self, req_ids: Iterable[str]) -> None:
        req_ids = list(req_ids)
        self.backoff.forget(req_ids)
        for req_id in req_ids:
            self._seen.pop(req_id, None)

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        self.backoff.verified(req_id, drafted, accepted)

    def propose(self, states: list[RequestState]) -> list[list[int]]:
        if self._kv is None:
            raise RuntimeError("DraftModel.propose() before allocate(): the drafter has no KV cache yet")
        rows: list[_Row] = []
        for state in states:
            n = min(state.num_tokens, self.max_model_len)
            num_drafts = min(self.backoff.drafts_for(state.req_id, self.num_tokens), self.max_model_len - n)
            if num_drafts <= 0:
                continue
            tokens = state.token_ids(n)
            seen = self._seen.get(state.req_id)
            start = min(seen.valid(tokens) if seen is not None else 0, n - 1)
            rows.append(_Row(state, tokens, start, num_drafts))
        drafts: dict[str, list[int]] = {r.state.req_id: [] for r in rows}
        if rows:
            self._catch_up(rows, drafts)
            self._decode(rows, drafts)
        for r in rows:
            self._seen[r.state.req_id] = SeenTokens(len(r.tokens), drafts[r.state.req_id][:-1])
        return [drafts.get(s.req_id, []) for s in states]

    # -- drafter programs --------------------------------------------------------------------
    def _catch_up(self, rows: list[_Row], drafts: dict[str, list[int]]) -> None:
        """Feed every row what its KV lacks and take its first draft: one verify-shaped step for
        rows at most ``1 + K`` tokens behind (the steady state), a prefill for the others."""
        width = 1 + self.num_tokens
        short = [r for r in rows if self.caps.supports_verify_decode and len(r.tokens) - r.start <= width]
        long = [r for r in rows if r not in short]
        if long:
            logits = self._prefill(long)
            for r, row_logits in zip(long, logits, strict=True):
                drafts[r.state.req_id].append(int(row_logits.argmax()))
        if short:
            tokens = torch.zeros((self.num_slots, width), dtype=torch.int32)
            valid = torch.zeros(self.num_slots, dtype=torch.int32)
            start = torch.full((self.num_slots,), -1, dtype=torch.int32)
            for r in short:
                fed = r.tokens[r.start:]
                tokens[r.state.slot, : len(fed)] = torch.tensor(fed, dtype=torch.int32)
                valid[r.state.slot] = len(fed)
                start[r.state.slot] = r.start
            raw = self.model.decode_forward(
                tokens=tokens, start_pos=start, page_table=self._table(short), kv_cache=self._kv,
                enable_trace=False, read_from_device=True, **{VERIFY_KWARG: valid},
            )
            if hasattr(self.model, "process_decode_output_host"):
                raw = self.model.process_decode_output_host(raw, is_tokens=False)
            for r in short:
                last = len(r.tokens) - r.start - 1
                drafts[r.state.req_id].append(int(raw[r.state.slot, last].argmax()))

    def _prefill(self, rows: list[_Row]) -> torch.Tensor:
        ends = [len(r.tokens) for r in rows]
        tokens = torch.zeros((len(rows), max(ends)), dtype=torch.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r.tokens)] = torch.tensor(r.tokens, dtype=torch.int32)
        raw = self.model.prefill_forward(
            tokens=tokens, page_table=page_table([r.state for r in rows], self._table_width, self._blocks_per_lane),
            kv_cache=self._kv, prompt_lens=np.array(ends, dtype=np.int64),
            start_pos=np.array([r.start for r in rows], dtype=np.int64), empty_slots=[r.state.slot for r in rows],
            enable_trace=False,
        )
        out = model_output.parse(raw, sampled_on_device=False, owner=f"{type(self.model).__qualname__}.prefill_forward")
        assert out.logits is not None  # parse() of host-sampled output always has logits
        return out.logits

    def _decode(self, rows: list[_Row], drafts: dict[str, list[int]]) -> None:
        """``K - 1`` plain decode steps: each feeds a row's newest draft and takes the next."""
        for j in range(1, self.num_tokens):
            live = [r for r in rows if r.num_drafts > j]
            if not live:
                return
            tokens = torch.zeros((self.num_slots, 1), dtype=torch.int32)
            positions = torch.full((self.num_slots,), -1, dtype=torch.int32)
            for r in live:
                tokens[r.state.slot, 0] = drafts[r.state.req_id][-1]
                positions[r.state.slot] = len(r.tokens) - 1 + j
            raw = self.model.decode_forward(tokens=tokens, start_pos=positions, page_table=self._table(live),
                                            kv_cache=self._kv, enable_trace=False, read_from_device=True)
            out = model_output.read_decode(self.model, raw, sampled_on_device=False, rows=self.num_slots)
            assert out.logits is not None  # host-sampled: logits
            for r in live:
                drafts[r.state.req_id].append(int(out.logits[r.state.slot].argmax()))

    def _table(self, rows: list[_Row]) -> torch.Tensor:
        by_slot: list[RequestState | None] = [None] * self.num_slots
        for r in rows:
            by_slot[r.state.slot] = r.state
        return page_table(by_slot, self._table_width, self._blocks_per_lane)
