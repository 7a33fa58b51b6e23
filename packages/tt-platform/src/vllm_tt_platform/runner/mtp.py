"""``method: mtp`` (vLLM's ``deepseek_mtp``, ``qwen3_5_mtp``, ...): the target checkpoint's
own MTP module drafts K tokens per row, run by the model on the mesh (``mtp_forward``).

The model keeps its steps' final hidden states on the device (the MTP module reads them), so
the runner sends only token ids: per row, the tokens the target has confirmed since the row's
last drafts (each pairs with the hidden state one position before it), and gets K draft ids
back. The module's KV has one page per target block, like a drafter model's
(``draft_model``: vLLM reserves K lookahead slots per row for ``mtp`` too), so it needs no
block table of its own and its bytes join the same KV budget: it takes the table of the
target's first attention group (a hybrid target's others hold recurrent states or windows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import AttentionSpec

from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.drafters import DraftBackoff
from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout
from vllm_tt_platform.runner.step import page_table


class MtpDrafts:
    """The model's MTP module as the runner's ``Drafter``."""

    def __init__(self, vllm_config: VllmConfig, model: Any, layer_spec: AttentionSpec, num_tokens: int,
                 num_slots: int, layout: Callable[[], KVLayout | None] = lambda: None) -> None:
        """``layout``: the target's planned KV layout once vLLM has planned it (None: one group)."""
        layers = int(getattr(model, "mtp_layers", 0) or 0)
        if not callable(getattr(model, "mtp_forward", None)) or layers < 1:
            raise TTConfigError(
                "--speculative-config method", "mtp",
                "a checkpoint whose model runs an MTP module (its config's num_nextn_predict_layers or "
                "mtp_num_hidden_layers, and the MTP weights)",
                f"{vllm_config.model_config.model} has none: use method ngram or draft_model, or serve a "
                "checkpoint that ships its MTP weights",
            )
        self.model = model
        self.layer_spec = layer_spec
        self._layout = layout
        self.num_layers = layers
        self.num_tokens = num_tokens
        self.num_slots = num_slots
        self.max_model_len = vllm_config.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        self._kv: Any = None
        self._table_width = 0
        self._blocks_per_lane = 0
        self._read: dict[str, int] = {}
        """Per row: the first position whose hidden state the module has not read yet."""
        self.backoff = DraftBackoff()

    @property
    def bytes_per_block(self) -> int:
        """The module's KV bytes per target block (one layer's page per MTP module)."""
        return self.layer_spec.page_size_bytes * self.num_layers

    def allocate(self, num_blocks: int, table_width: int, heads_per_device: Callable[[int], int]) -> None:
        spec = self.layer_spec
        shape = (num_blocks, heads_per_device(spec.num_kv_heads), self.block_size, spec.head_size)
        self._kv = self.model.allocate_mtp_kv_cache(shape, spec.dtype)
        self._table_width = table_width
        self._blocks_per_lane = num_blocks

    def narrow(self, max_model_len: int, table_width: int) -> None:
        self.max_model_len = max_model_len
        self._table_width = table_width

    def describe(self, num_blocks: int | None = None) -> str:
        kv = f"{self.bytes_per_block / 1024:.1f} KiB/block"
        if num_blocks is not None:
            kv += f" = {self.bytes_per_block * num_blocks / 2**20:.1f} MiB/lane"
        return (f"the checkpoint's MTP module ({self.num_layers} layer) inside the model on the mesh, "
                f"hidden states kept on device, KV {kv}")

    def forget(self, req_ids: Iterable[str]) -> None:
        req_ids = list(req_ids)
        self.backoff.forget(req_ids)
        for req_id in req_ids:
            self._read.pop(req_id, None)

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        self.backoff.verified(req_id, drafted, accepted)

    def propose(self, states: list[RequestState]) -> list[list[int]]:
        if self._kv is None:
            raise RuntimeError("MtpDrafts.propose() before allocate(): the MTP module has no KV cache yet")
        rows = []
        for state in states:
            n = state.num_tokens
            # A row K positions from the end drafts nothing: the module's K positions must fit.
            k = self.backoff.drafts_for(state.req_id, self.num_tokens) if n + self.num_tokens <= self.max_model_len else 0
            start = self._read.get(state.req_id, 0)
            if k > 0 and n - 1 > start:  # a skipped row keeps its unread positions for later
                rows.append((state, state.token_ids(n)[start + 1 :], start, k))
                self._read[state.req_id] = n - 1
        if not rows:
            return [[] for _ in states]
        width = max(len(fed) for _, fed, _, _ in rows)
        tokens = torch.zeros((self.num_slots, width), dtype=torch.int32)
        start_pos = torch.full((self.num_slots,), -1, dtype=torch.int32)
        valid = torch.zeros(self.num_slots, dtype=torch.int32)
        by_slot: list[RequestState | None] = [None] * self.num_slots
        for state, fed, start, _ in rows:
            tokens[state.slot, : len(fed)] = torch.tensor(fed, dtype=torch.int32)
            start_pos[state.slot], valid[state.slot] = start, len(fed)
            by_slot[state.slot] = state
        drafts = self.model.mtp_forward(
            tokens=tokens, start_pos=start_pos, num_valid_tokens=valid,
            page_table=page_table(by_slot, self._table_width, self._blocks_per_lane, self._attention_group()),
            kv_cache=self._kv,
            num_drafts=self.num_tokens,
        )
        out: dict[str, list[int]] = {}
        for state, _, _, k in rows:
            out[state.req_id] = [int(t) for t in drafts[state.slot, :k].tolist() if t >= 0]
        return [out.get(s.req_id, []) for s in states]

    def _attention_group(self) -> KVGroup | None:
        layout = self._layout()
        return None if layout is None else layout.attention_group
