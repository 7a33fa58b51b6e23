"""The TT model runner and vLLM's KV cache manager, reduced to what the host-model tests need.

One driver for every KV layout the host reference models take (one paged cache, hybrid
sliding/full groups sharing tensors, one latent per token, a recurrent state per request next
to paged attention): a shuffled block pool per lane
(block 0 is vLLM's null block, never handed out), one block table per KV cache group, whole
histories in prefill chunks (``start_pos > 0`` for later chunks and prefix hits), full
fixed-batch decode with padding rows, and per-layer page tables padded to the warmup batch as
the runner sends them. Before each step a sliding group drops the blocks its window no longer
reaches (table entry -> null block), as vLLM does; dropped blocks can be spoiled so that reading
one changes the logits, and handed out again. A recurrent group (vLLM's ``MambaSpec``) holds
one state block per request whatever its length (``mamba_cache_mode`` none) or, with
``state_boundaries`` (vLLM's ``align`` mode, prefix caching on), a position-indexed row: the
block of the step's last token gets a fresh state block (the entries before it are null), so
each block boundary a step ends on leaves its state behind for a prefix hit. The row goes to
the model as the runner sends it: the step's read and write blocks (``KVGroup.state_blocks``).
With ``state_slots`` (speculative decoding) a request holds that many state blocks, the ring
the runner resolves, and ``verify`` runs a verify step with greedy acceptance.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from vllm_tt_host.models.qwen3_5.gated_delta import RecurrentState
from vllm_tt_platform.runner.kv_layout import KVGroup

Spoil = Literal["nan", "noise"]
"""What a dropped (or initially spoiled) block is filled with: NaN shows any read at all, even a
masked one; large noise shows a read that reaches the softmax."""

RECURRENT: Literal["recurrent"] = "recurrent"
"""A layer kind next to the sliding windows: a recurrent-state layer (one block per request)."""

Group = int | Literal["recurrent"] | None
"""A KV cache group: its sliding window, ``RECURRENT``, or None for full attention."""


@dataclass
class Seq:
    """One request: its prompt, block table per KV cache group and what it generated."""

    prompt: list[int]
    tables: dict[Group, list[int]]
    """Per KV cache group (see ``Group``): the block table."""
    computed: int = 0
    end: int = 0
    """Token count once the step being prepared is computed."""
    generated: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def history(self) -> list[int]:
        return self.prompt + self.generated


class ContractDriver:
    """Drives ``prefill_forward`` / ``decode_forward`` of one host model.

    ``kv`` is what the model's ``allocate_kv_cache`` (or ``..._per_layer``) returned: per lane,
    per layer, ``(keys, values)`` of shape ``[blocks, kv heads, block size, head dim]`` or a
    ``RecurrentState``. ``windows`` is each layer's group: its sliding window, None (full
    attention) or ``RECURRENT``; without it the model takes the single-table contract (no
    ``page_tables_per_layer``). ``width`` is the page table's width in blocks."""

    def __init__(
        self,
        model: Any,
        kv: list[list[tuple[torch.Tensor, torch.Tensor]]],
        windows: Sequence[Group] | None = None,
        *,
        width: int = 24,
        seed: int = 0,
        spoil: Spoil | None = None,
        recycle: bool = False,
        free_outside_window: bool = True,
        state_boundaries: bool = False,
        state_slots: int = 1,
    ) -> None:
        self.model = model
        self.kv = kv
        self.windows = list(windows) if windows is not None else None
        keys = next(layer[0] for layer in kv[0] if not isinstance(layer, RecurrentState))
        self.num_blocks, self.block = keys.shape[0], keys.shape[2]
        self.group_block: dict[Group, int] = {
            window: layer[0].shape[2]
            for window, layer in zip(self.windows or [None], kv[0], strict=False)
            if not isinstance(layer, RecurrentState)
        }
        """Each paged group's block size, read from its layers' caches (vLLM may give full and
        sliding groups different ones at one page size); ``block`` is the first layer's."""
        self.width = width
        self.spoil_with, self.recycle, self.free_outside_window = spoil, recycle, free_outside_window
        self.states = KVGroup(0, (), self.block, None, recurrent=True, state_boundaries=state_boundaries,
                              state_slots=state_slots)
        self.rng = torch.Generator().manual_seed(seed)
        order = list(range(1, self.num_blocks))
        random.Random(seed).shuffle(order)
        self.free = [list(order) for _ in range(len(kv))]  # the same ids in every lane
        self.seqs: dict[int, Seq] = {}
        self.freed = 0
        self._null = [[t[0].clone() for t in self._tensors(lane)] for lane in range(len(kv))]

    @classmethod
    def per_layer(cls, model: Any, num_blocks: int, block: int, **kwargs: Any) -> ContractDriver:
        """Hybrid KV as vLLM lays it out for a model with per-layer KV shapes: each layer its own
        shape in its own storage slot, a KV-shared layer its source's; one group per window."""
        cfg = model.config
        kv = model.allocate_kv_cache_per_layer([
            ((num_blocks, cfg.kv_heads_of(i), block, cfg.head_dim_of(i)), torch.float32, cfg.kv_source(i))
            for i in range(cfg.num_layers)
        ])
        return cls(model, kv, [cfg.window(i) for i in range(cfg.num_layers)], **kwargs)

    # ---- state ------------------------------------------------------------------------

    def _tensors(self, lane: int) -> list[torch.Tensor]:
        """Every distinct KV tensor of one lane (layers may share one)."""
        seen: dict[int, torch.Tensor] = {}
        for layer in self.kv[lane]:
            for tensor in (layer.conv, layer.recurrent) if isinstance(layer, RecurrentState) else layer:
                seen.setdefault(id(tensor), tensor)
        return list(seen.values())

    def spoil(self, lane: int, block: int | None = None) -> None:
        """Fill ``block`` (every block when None) of every tensor of ``lane`` with garbage."""
        for tensor in self._tensors(lane):
            target = tensor if block is None else tensor[block]
            if self.spoil_with == "nan":
                target.fill_(float("nan"))
            else:
                target.copy_(torch.randn(target.shape, generator=self.rng) * 100)
        if block in (None, 0):
            self._null[lane] = [t[0].clone() for t in self._tensors(lane)]

    def null_block_untouched(self) -> bool:
        """Padding rows and null table entries never write block 0."""
        return all(
            torch.equal(t[0], kept)
            for lane, blocks in enumerate(self._null)
            for t, kept in zip(self._tensors(lane), blocks, strict=True)
        )

    @property
    def groups(self) -> list[Group]:
        """Sliding windows by size, then the recurrent group, then full attention."""
        if not self.windows:
            return [None]
        return sorted(set(self.windows), key=lambda w: (w is None, w == RECURRENT, w if isinstance(w, int) else 0))

    def add(self, slot: int, prompt: list[int], prefix_of: int | None = None, cached_blocks: int = 0) -> None:
        """Admit a request; a prefix-cache hit reuses ``cached_blocks`` full blocks of
        ``prefix_of``: all of them in a full group, in a sliding group only those the window of
        the first computed position reaches (the others are null), in a recurrent group the
        state cached at the hit's last block boundary. Without ``state_boundaries`` a recurrent
        group takes the request's ``state_slots`` state blocks now, as vLLM allocates them, and
        no hits."""
        tables: dict[Group, list[int]] = {window: [] for window in self.groups}
        boundaries = self.states.state_boundaries
        if RECURRENT in tables and not boundaries:
            if prefix_of is not None:
                raise ValueError("a recurrent-state model takes prefix-cache hits only with state_boundaries")
            pool = self.free[self.model.lanes.lane_of(slot)]
            tables[RECURRENT].extend(pool.pop() for _ in range(self.states.state_slots))
        if prefix_of is not None:
            start = cached_blocks * self.block
            for window, source in self.seqs[prefix_of].tables.items():
                size = self.group_block.get(window, self.block)
                first = max(0, start - window + 1) // size if isinstance(window, int) else 0
                if window == RECURRENT:
                    first = cached_blocks - 1
                tables[window] = [0] * first + source[first : start // size]
        self.seqs[slot] = Seq(prompt, tables, computed=cached_blocks * self.block)

    def _prepare(self, slot: int, computed: int, length: int) -> None:
        """Drop what left each sliding window (vLLM frees before it allocates), then cover
        ``length`` positions from the lane's pool."""
        lane = self.model.lanes.lane_of(slot)
        self.seqs[slot].end = length
        for window, table in self.seqs[slot].tables.items():
            if window == RECURRENT:
                if self.states.state_boundaries:  # the last token's block gets a state block
                    last = (length - 1) // self.block
                    table.extend([0] * (last + 1 - len(table)))
                    if not table[last]:
                        table[last] = self.free[lane].pop()
                continue  # else its one state block, taken at admission
            size = self.group_block[window]
            if isinstance(window, int) and self.free_outside_window:
                for j in range(max(0, computed - window + 1) // size):
                    if table[j]:
                        if self.spoil_with is not None:
                            self.spoil(lane, table[j])
                        if self.recycle:
                            self.free[lane].insert(0, table[j])
                        table[j] = 0
                        self.freed += 1
            while len(table) * size < length:
                table.append(self.free[lane].pop())

    def page_tables(self, slots: list[int | None], width: int) -> list[torch.Tensor]:
        """Per layer (one entry without windows): the rows' block tables, zero padded."""
        layers = self.windows if self.windows is not None else [None]
        tables = []
        for window in layers:
            table = torch.zeros(len(slots), width, dtype=torch.int32)
            for row, slot in enumerate(slots):
                if slot is not None:
                    seq = self.seqs[slot]
                    blocks = seq.tables[window]
                    if window == RECURRENT:
                        blocks = list(self.states.state_blocks(blocks, seq.computed, seq.end))
                    table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            tables.append(table)
        return tables

    def _table_kwargs(self, slots: list[int | None], rows: int) -> dict[str, Any]:
        """``page_table`` for ``slots``; per-layer tables padded to ``rows`` when hybrid."""
        tables = self.page_tables(slots + [None] * (rows - len(slots)), self.width)
        kwargs: dict[str, Any] = {"page_table": tables[0][: len(slots)]}
        if self.windows is not None:
            kwargs["page_tables_per_layer"] = tables
        return kwargs

    # ---- steps ------------------------------------------------------------------------

    def prefill(self, chunks: list[tuple[int, int]], **kwargs: Any) -> Any:
        """One prefill step: ``(slot, end)`` computes ``[computed, end)`` of that request."""
        width = max(len(self.seqs[s].history) for s, _ in chunks)
        tokens = torch.zeros(len(chunks), width, dtype=torch.int32)
        for row, (slot, end) in enumerate(chunks):
            self._prepare(slot, self.seqs[slot].computed, end)
            history = self.seqs[slot].history
            tokens[row, : len(history)] = torch.tensor(history)
        slots: list[int | None] = [s for s, _ in chunks]
        out = self.model.prefill_forward(
            tokens=tokens,
            kv_cache=self.kv,
            prompt_lens=[end for _, end in chunks],
            start_pos=[self.seqs[s].computed for s, _ in chunks],
            empty_slots=[s for s, _ in chunks],
            **self._table_kwargs(slots, self.model.max_batch_size),
            **kwargs,
        )
        records = not kwargs.get("return_all_logits") and "sampling_params" not in kwargs
        for row, (slot, end) in enumerate(chunks):
            seq = self.seqs[slot]
            seq.computed = end
            if end == len(seq.history) and records:  # the last chunk
                seq.logits.append(out[row, -1])
                seq.generated.append(int(out[row, -1].argmax()))
        return out

    def prompt_logits(self, prompt: list[int], slot: int = 0) -> torch.Tensor:
        """``[len(prompt), V]``: the logits at every position of ``prompt``, admitted in ``slot``
        and prefilled in one chunk."""
        self.add(slot, prompt)
        return self.prefill([(slot, len(prompt))], return_all_logits=True)[0]

    def decode(self, steps: int, **kwargs: Any) -> None:
        """``steps`` greedy decode steps of every admitted request; other rows are padding."""
        rows = self.model.max_batch_size
        for _ in range(steps):
            tokens = torch.zeros(rows, 1, dtype=torch.int32)
            start = torch.full((rows,), -1, dtype=torch.int32)
            for slot, seq in self.seqs.items():
                position = len(seq.history) - 1
                self._prepare(slot, position, position + 1)
                tokens[slot, 0] = seq.history[-1]
                start[slot] = position
            slots = [s if s in self.seqs else None for s in range(rows)]
            out = self.model.decode_forward(
                tokens=tokens, start_pos=start, kv_cache=self.kv, **self._table_kwargs(slots, rows), **kwargs
            )
            for slot, seq in self.seqs.items():
                seq.computed = len(seq.history)
                seq.logits.append(out[slot, -1])
                seq.generated.append(int(out[slot, -1].argmax()))

    def verify(self, drafts: dict[int, list[int]], num_tokens: int, **kwargs: Any) -> torch.Tensor:
        """One verify step of every admitted request (``[rows, 1 + num_tokens]``: its last token,
        then ``drafts[slot]``), kept greedily as vLLM's rejection sampler keeps greedy rows: the
        drafts up to the first one the model's argmax disagrees with, then the argmax there.
        Returns the step's logits ``[rows, 1 + num_tokens, V]``."""
        rows = self.model.max_batch_size
        tokens = torch.zeros(rows, 1 + num_tokens, dtype=torch.int32)
        start = torch.full((rows,), -1, dtype=torch.int32)
        valid = torch.zeros(rows, dtype=torch.int32)
        for slot, seq in self.seqs.items():
            position, row = len(seq.history) - 1, drafts.get(slot, [])
            self._prepare(slot, position, position + 1 + len(row))
            seq.end = position + 1  # the state row: the step's read block, then one per position
            tokens[slot, : 1 + len(row)] = torch.tensor([seq.history[-1], *row])
            start[slot], valid[slot] = position, 1 + len(row)
        slots = [s if s in self.seqs else None for s in range(rows)]
        out = self.model.decode_forward(tokens=tokens, start_pos=start, kv_cache=self.kv,
                                        num_valid_tokens=valid, **self._table_kwargs(slots, rows), **kwargs)
        for slot, seq in self.seqs.items():
            row = drafts.get(slot, [])
            kept = 0
            while kept < len(row) and int(out[slot, kept].argmax()) == row[kept]:
                kept += 1
            seq.logits.extend(out[slot, j] for j in range(kept + 1))
            seq.generated.extend([*row[:kept], int(out[slot, kept].argmax())])
            seq.computed = len(seq.history) - 1
        return out
