"""``HostDecoder``: the Llama-style decoder math in torch, reading and writing a paged KV cache.

Prefill and decode share every layer op; they differ only in how many query tokens a row has
and which cache blocks the keys come from. KV is written to the cache first and attention then
reads it back through the page table, as the device does, so a wrong page table shows up as
wrong tokens rather than being hidden by a shortcut.

Each layer has its own page table (hybrid KV: vLLM keeps one block table per KV cache group)
and its own attention kind: full, or a sliding window that reads only the blocks its window
reaches. Families whose layers differ in more than that (norms, activation, attention scale)
subclass and override the per-layer hooks (``_embed``, ``_norm``, ``_attend``, ...; Gemma 4's
per-layer input embeddings through ``_per_layer_inputs``, which ``_finish_layer`` takes); a family
with layers of another kind among its attention layers (Mllama's cross-attention) overrides one
layer (``_prefill_layer``, ``_decode_layer``); one whose layers are not all attention (Qwen 3.5's
delta-net) overrides the layer stacks (``_prefill_layers``, ``_decode_layers``) and keeps the
entry points and their contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.checkpoint import (
    AttentionWeights,
    DecoderWeights,
    LayerWeights,
    load_decoder_weights,
)
from vllm_tt_host.models.frame.config import DecoderConfig
from vllm_tt_host.models.frame.mlp import gated_mlp
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.rope import RotaryEmbedding
from vllm_tt_host.models.frame.shapes import HostModelInputError

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.mtp import MtpModule


@dataclass(frozen=True)
class PrefillInserts:
    """What one prefill row carries beyond its token ids (a vision-language model's images)."""

    index: torch.Tensor
    """``[m]``: offsets into the row's new tokens whose embeddings are replaced..."""
    vectors: torch.Tensor
    """...by these ``[m, hidden]`` (the projected image features, not scaled)."""
    blocks: torch.Tensor
    """``[end]``: each position's bidirectional block (-1: causal only); see ``paged_kv.visible``."""
    layer_adds: tuple[torch.Tensor, ...] = ()
    """DeepStack (Qwen3-VL): entry ``k`` ``[m, hidden]`` is added at ``index`` to the hidden
    states leaving layer ``k``; the image features of the tower's middle blocks thus reach the
    first ``len(layer_adds)`` layers. Prefill only: decode tokens are never image tokens."""


def insert_embeddings(x: torch.Tensor, inserts: PrefillInserts | None) -> torch.Tensor:
    """The row's embeddings ``x`` with the inserted vectors in place (in place; returns ``x``)."""
    if inserts is not None:
        x[inserts.index] = inserts.vectors.to(x.dtype)
    return x


def add_after_layer(x: torch.Tensor, inserts: PrefillInserts | None, layer: int) -> torch.Tensor:
    """The hidden states leaving ``layer`` plus what the inserts add there (DeepStack)."""
    if inserts is not None and layer < len(inserts.layer_adds):
        x[inserts.index] += inserts.layer_adds[layer].to(x.dtype)
    return x


@dataclass(frozen=True)
class PrefillPass:
    """One prefill row's pass as every layer reads it."""

    start: int
    n: int
    """Real tokens from ``start``; the rest of the bucket is padding."""
    positions: torch.Tensor
    """``[bucket]``: the position of every query."""
    query_pos: torch.Tensor
    """``[1, bucket]``: the position each query's mask is cut at (padding: the last real one's)."""
    inserts: PrefillInserts | None

    def blocks_of(self, size: int) -> int:
        """Blocks of ``size`` tokens holding ``[0, start + n)`` (each layer reads its own size)."""
        return math.ceil((self.start + self.n) / size)


@dataclass(frozen=True)
class DecodeRows:
    """One decode step's rows as every layer reads them."""

    live: torch.Tensor
    """``[B]``: the rows that are not padding (position >= 0); only they write KV or state."""
    pos: torch.Tensor
    """``[B]`` long: each row's position; padding rows at 0, so they attend to key 0 only, which
    keeps their (ignored) output finite."""
    lanes: list[slice]
    """Each lane's rows of the batch (row ``r`` is in lane ``r // rows_per_lane``)."""

    @classmethod
    def of(cls, positions: torch.Tensor, rows_per_lane: int) -> DecodeRows:
        batch = positions.shape[0]
        return cls(
            live=positions >= 0,
            pos=positions.clamp(min=0).long(),
            lanes=[slice(i, i + rows_per_lane) for i in range(0, batch, rows_per_lane)],
        )


class HostDecoder:
    @classmethod
    def load(cls, folder: Path, config: Any) -> HostDecoder:
        """This decoder with the weights ``config`` (its family's config) needs from ``folder``;
        families whose checkpoints hold other tensors override it."""
        return cls(config, load_decoder_weights(folder, config))

    def __init__(self, config: DecoderConfig, weights: DecoderWeights) -> None:
        self.config = config
        self.weights = weights
        self.rotaries = tuple(
            RotaryEmbedding.of(config.rope_of(i), config.head_dim_of(i)) for i in range(config.num_layers)
        )
        self.mtp: MtpModule | None = None
        """The checkpoint's MTP module, for families that load one (``frame.mtp``)."""
        self.keep_hidden = False
        self.aux_layers: tuple[int, ...] = ()
        """With ``keep_hidden``, the layers whose entering residual stream is kept instead of the
        final hidden (an EAGLE-3 head's ``eagle_aux_hidden_state_layer_ids``; ``num_layers``: the
        last layer's output before the final norm), joined in this order."""
        self._aux: dict[int, torch.Tensor] = {}
        self.last_hidden: torch.Tensor | None = None
        """``[T, hidden]`` of the last ``prefill`` (its real positions) or ``[B, hidden]`` of
        the last ``decode``, when ``keep_hidden`` (``[., len(aux_layers) * hidden]`` with
        ``aux_layers``)."""

    @torch.no_grad()
    def prefill(
        self,
        new_tokens: torch.Tensor,
        start: int,
        bucket: int,
        page_rows: Sequence[torch.Tensor],
        lane_kv: LaneKV,
        all_positions: bool = False,
        inserts: PrefillInserts | None = None,
    ) -> torch.Tensor:
        """Run one row's tokens ``new_tokens [n]`` at positions ``[start, start+n)``, padded to
        ``bucket`` positions, attending to ``[0, start+n)`` (a sliding layer: to its window);
        return the logits ``[V]`` after the last real token, or ``[n, V]`` after each real
        token with ``all_positions`` (prompt logprobs). ``page_rows`` holds the row's page
        table of each layer. Only the ``n`` real positions write KV. ``inserts`` replaces some
        embeddings and lets blocks of positions attend both ways."""
        n = new_tokens.shape[0]
        x = self._prefill_layers(new_tokens, start, bucket, page_rows, lane_kv, inserts)
        self._keep_hidden(x[:n])
        if all_positions:
            return self._logits(x[:n])
        return self._logits(x[n - 1 : n])[0]

    def _prefill_layers(self, new_tokens: torch.Tensor, start: int, bucket: int, page_rows: Sequence[torch.Tensor],
                        lane_kv: LaneKV, inserts: PrefillInserts | None) -> torch.Tensor:
        """The hidden states after the last layer, ``[bucket, hidden]`` (the first ``n`` real)."""
        x, per_layer, row = self._prefill_inputs(new_tokens, start, bucket, inserts)
        for index, (layer, layer_kv, page_row) in enumerate(zip(self.weights.layers, lane_kv, page_rows, strict=True)):
            layer_input = None if per_layer is None else per_layer[:, index]
            self._capture(index, x)
            x = add_after_layer(self._prefill_layer(index, layer, x, layer_kv, page_row, row, layer_input),
                                inserts, index)
        return x

    def _prefill_inputs(self, new_tokens: torch.Tensor, start: int, bucket: int,
                        inserts: PrefillInserts | None) -> tuple[torch.Tensor, torch.Tensor | None, PrefillPass]:
        """What the first layer of a prefill row reads: the embeddings ``[bucket, hidden]``, the
        ``_per_layer_inputs`` of them, and the row's ``PrefillPass``."""
        n = new_tokens.shape[0]
        end = start + n
        positions = start + torch.arange(bucket)
        ids = F.pad(new_tokens.long(), (0, bucket - n))
        x = insert_embeddings(self._embed(ids), inserts)
        row = PrefillPass(
            start=start, n=n, positions=positions,
            # Padding queries see what the last real one sees: their rows stay finite, unread.
            query_pos=positions.clamp(max=end - 1)[None], inserts=inserts,
        )
        return x, self._per_layer_inputs(ids, x), row

    def _prefill_layer(self, index: int, layer: LayerWeights, x: torch.Tensor, layer_kv: list[torch.Tensor],
                       page_row: torch.Tensor, row: PrefillPass, layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``index`` of one prefill row: write its KV, attend, MLP (``layer_input``: the
        layer's slice of ``_per_layer_inputs``)."""
        k_cache, v_cache = layer_kv
        n, size = row.n, paged_kv.tokens_per_block(k_cache)
        window = self.config.window(index)
        first = paged_kv.first_block(torch.tensor([row.start]), window, size)
        blocks = self._image_blocks(index, row.inserts)
        if blocks is not None and window is not None and self.blocks_past_window:
            first = torch.minimum(first, torch.tensor([self._block_keys_from(blocks, row, window)]) // size)
        pages_used, key_pos = paged_kv.key_span(page_row[None], first, row.blocks_of(size) - int(first), size)
        mask = paged_kv.visible(key_pos, row.query_pos, window, blocks, self.blocks_past_window)
        pages, offsets = paged_kv.locate(page_row[None].expand(n, -1), row.positions[:n], size)
        q, k, v = self._qkv(self._norm(x, layer.input_norm), index, layer, row.positions)
        if self.config.kv_source(index) == index:  # a KV-shared layer reads its source's KV
            paged_kv.write(k_cache, pages, offsets, k[:n])
            paged_kv.write(v_cache, pages, offsets, v[:n])
        keys = paged_kv.gather(k_cache, pages_used)
        values = paged_kv.gather(v_cache, pages_used)
        out = self._attend(q.transpose(0, 1)[None], keys, values, mask[:, None], index)
        return self._finish_layer(x, out[0].transpose(0, 1), layer, layer_input)

    @torch.no_grad()
    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        page_tables: Sequence[torch.Tensor],
        kv: list[LaneKV],
        rows_per_lane: int,
    ) -> torch.Tensor:
        """One token per row: ``tokens [B]`` at ``positions [B]`` (-1 = padding row: no KV
        write, output meaningless), ``page_tables`` one ``[B, width]`` table per layer. Row
        ``r`` uses lane ``r // rows_per_lane``. Returns ``[B, V]``."""
        step = DecodeRows.of(positions, rows_per_lane)
        x = self._embed(tokens.long())
        x = self._decode_layers(x, step, page_tables, kv, self._per_layer_inputs(tokens.long(), x))
        self._keep_hidden(x)
        return self._logits(x)

    @torch.no_grad()
    def mixed(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        page_tables: Sequence[torch.Tensor],
        kv: list[LaneKV],
        rows_per_lane: int,
        chunk: torch.Tensor,
        start: int,
        bucket: int,
        page_rows: Sequence[torch.Tensor],
        lane: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A mixed step: ``decode``'s rows and one prefill row (``chunk [n]`` at ``start``,
        padded to ``bucket``, in lane ``lane``) in one walk over the layers, each layer running
        the decode rows, then the chunk; returns ``decode``'s ``[B, V]`` and ``prefill``'s
        ``[V]``. The rows never read each other's KV, so the result is the two calls'."""
        step = DecodeRows.of(positions, rows_per_lane)
        x = self._embed(tokens.long())
        per_layer = self._per_layer_inputs(tokens.long(), x)
        y, chunk_per_layer, row = self._prefill_inputs(chunk, start, bucket, None)
        for index, layer in enumerate(self.weights.layers):
            x = self._decode_layer(index, layer, x, step, page_tables[index], kv,
                                   None if per_layer is None else per_layer[:, index])
            y = self._prefill_layer(index, layer, y, kv[lane][index], page_rows[index], row,
                                    None if chunk_per_layer is None else chunk_per_layer[:, index])
        n = chunk.shape[0]
        return self._logits(x), self._logits(y[n - 1 : n])[0]

    @torch.no_grad()
    def early_exit(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        page_tables: Sequence[torch.Tensor],
        kv: list[LaneKV],
        rows_per_lane: int,
        num_layers: int,
    ) -> torch.Tensor:
        """``decode`` through the first ``num_layers`` layers only, then the final norm and LM
        head: a self-drafting model's cheap guess at its next token (``block_output``). Writes
        those layers' KV at ``positions``; the full pass that verifies the guess rewrites it."""
        step = DecodeRows.of(positions, rows_per_lane)
        x = self._embed(tokens.long())
        per_layer = self._per_layer_inputs(tokens.long(), x)
        for index, (layer, page_table) in enumerate(zip(self.weights.layers[:num_layers], page_tables, strict=False)):
            layer_input = None if per_layer is None else per_layer[:, index]
            x = self._decode_layer(index, layer, x, step, page_table, kv, layer_input)
        return self._logits(x)

    def verify_tables(self, tables: Sequence[torch.Tensor], j: int) -> list[torch.Tensor]:
        """The page tables verify position ``j`` runs with (``frame.verify``): a paged layer's
        are position-indexed, the same at every position; a family whose layers keep a
        per-request state overrides it (Qwen 3.5: one state slot per verify position)."""
        return list(tables)

    def _keep_hidden(self, x: torch.Tensor) -> None:
        """With ``keep_hidden`` (an MTP module or EAGLE-3 head drafts from them), the last call's
        final hidden states after the model's norm (what the target hands its MTP module), or
        with ``aux_layers`` its auxiliary hidden states (what an EAGLE-3 head reads)."""
        if not self.keep_hidden:
            return
        if not self.aux_layers:
            self.last_hidden = self._norm(x, self.weights.norm)
            return
        self._capture(len(self.weights.layers), x)
        self.last_hidden = torch.cat([self._aux[i][: x.shape[0]] for i in self.aux_layers], dim=-1)
        self._aux = {}

    def _capture(self, index: int, x: torch.Tensor) -> None:
        """The residual stream entering layer ``index``, when an EAGLE-3 head reads it."""
        if self.keep_hidden and index in self.aux_layers:
            self._aux[index] = x

    def _decode_layers(self, x: torch.Tensor, step: DecodeRows, page_tables: Sequence[torch.Tensor],
                       kv: list[LaneKV], per_layer: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden states ``[B, hidden]`` after the last layer, from the embeddings ``x``
        (and ``_per_layer_inputs`` of them)."""
        for index, (layer, page_table) in enumerate(zip(self.weights.layers, page_tables, strict=True)):
            layer_input = None if per_layer is None else per_layer[:, index]
            self._capture(index, x)
            x = self._decode_layer(index, layer, x, step, page_table, kv, layer_input)
        return x

    def _decode_layer(self, index: int, layer: LayerWeights, x: torch.Tensor, step: DecodeRows,
                      page_table: torch.Tensor, kv: list[LaneKV], layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``index`` of one decode step over every row (``layer_input`` as for
        ``_prefill_layer``); a family overrides it for layers of another kind."""
        return self.decode_layer(x, step, index, layer, page_table, [lane_kv[index] for lane_kv in kv], layer_input)

    def decode_layer(self, x: torch.Tensor, step: DecodeRows, index: int, layer: LayerWeights,
                     page_table: torch.Tensor, caches: Sequence[Sequence[torch.Tensor]],
                     layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """One attention layer of a decode step: ``x [B, hidden]`` in and out, the layer's KV
        ``caches`` one ``[K, V]`` per lane (an MTP module's block runs through here too): write
        the live rows' KV, attend, MLP."""
        live, pos, size = step.live, step.pos, paged_kv.tokens_per_block(caches[0][0])
        window = self.config.window(index)
        first = paged_kv.first_block(pos, window, size)
        pages_used, key_pos = paged_kv.key_span(page_table, first, int((pos // size - first).max()) + 1, size)
        mask = paged_kv.visible(key_pos, pos[:, None], window)
        pages, offsets = paged_kv.locate(page_table, pos, size)
        q, k, v = self._qkv(self._norm(x, layer.input_norm), index, layer, pos)
        keys, values = [], []
        for (k_cache, v_cache), rows in zip(caches, step.lanes, strict=True):
            write = live[rows]
            if self.config.kv_source(index) == index:
                paged_kv.write(k_cache, pages[rows][write], offsets[rows][write], k[rows][write])
                paged_kv.write(v_cache, pages[rows][write], offsets[rows][write], v[rows][write])
            keys.append(paged_kv.gather(k_cache, pages_used[rows]))
            values.append(paged_kv.gather(v_cache, pages_used[rows]))
        out = self._attend(q[:, :, None, :], torch.cat(keys), torch.cat(values), mask[:, None], index)
        return self._finish_layer(x, out[:, :, 0, :], layer, layer_input)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weights.embed[ids]

    blocks_past_window = False
    """Whether a query of a bidirectional block sees the whole block on a sliding layer (Gemma 4
    Unified), not only the part inside its window (``paged_kv.visible``)."""

    def _block_keys_from(self, blocks: torch.Tensor, row: PrefillPass, window: int) -> int:
        """The first key position the blocks of the pass's queries reach (``blocks_past_window``):
        the sliding group keeps only the window before the pass, so a block reaching further
        (a start inside a block longer than the window) is refused."""
        live = blocks[row.start : row.start + row.n]
        ids = live[live >= 0].unique()
        if ids.numel() == 0:
            return row.start
        earliest = int(torch.isin(blocks, ids).nonzero()[0])
        if earliest < row.start - window + 1:
            raise HostModelInputError(
                f"a prefill pass from position {row.start} computes part of an image whose tokens from {earliest} "
                f"on it attends to, further back than the sliding window ({window}) keeps: a chunk or "
                "prefix-cache hit must not start inside such an image (serve without prefix caching)"
            )
        return earliest

    def _image_blocks(self, index: int, inserts: PrefillInserts | None) -> torch.Tensor | None:
        """The bidirectional blocks layer ``index`` attends with (Gemma 4: its sliding layers only)."""
        return None if inserts is None else inserts.blocks

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """``[T, layers, d]``: what each layer adds beside the residual stream, from the token
        ids and their embeddings ``x`` (Gemma 4's per-layer input embeddings); ``None`` here."""
        return None

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_norm_eps)

    def _qkv(
        self, h: torch.Tensor, index: int, layer: LayerWeights, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project ``h [T, H]`` to rotated q ``[T, heads, d]`` and k, v ``[T, kv_heads, d]``."""
        a: AttentionWeights = layer.attention
        cfg = self.config
        tokens = h.shape[0]
        q = F.linear(h, a.q, a.q_bias).view(tokens, cfg.num_heads, cfg.head_dim)
        k = F.linear(h, a.k, a.k_bias).view(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = F.linear(h, a.v, a.v_bias).view(tokens, cfg.num_kv_heads, cfg.head_dim)
        if a.q_norm is not None and a.k_norm is not None:
            q = self._norm(q, a.q_norm)
            k = self._norm(k, a.k_norm)
        rotary = self.rotaries[index]
        return rotary.rotate(q, positions), rotary.rotate(k, positions), v

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, index: int
    ) -> torch.Tensor:
        """Grouped-query attention of layer ``index``: ``q [B, heads, Tq, d]`` over
        ``[B, kv_heads, Tk, d]``, ``mask [B, 1, Tq, Tk]``."""
        groups = self.config.kv_groups
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=self.config.head_dim**-0.5
        )

    def _finish_layer(
        self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights, per_layer_input: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Output projection and MLP, each with its residual; ``attn`` is ``[T, heads, d]``,
        ``per_layer_input`` this layer's slice of ``_per_layer_inputs`` (unused here)."""
        a = layer.attention
        x = x + F.linear(attn.reshape(x.shape[0], -1), a.o, a.o_bias)
        return x + gated_mlp(self._norm(x, layer.post_attention_norm), layer.mlp)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.weights.norm), self.weights.lm_head)
