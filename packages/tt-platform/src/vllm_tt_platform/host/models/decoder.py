"""``HostDecoder``: the Llama-style decoder math in torch, reading and writing a paged KV cache.

Prefill and decode share every layer op; they differ only in how many query tokens a row has
and which cache blocks the keys come from. KV is written to the cache first and attention then
reads it back through the page table, as the device does, so a wrong page table shows up as
wrong tokens rather than being hidden by a shortcut.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vllm_tt_platform.host.models import paged_kv
from vllm_tt_platform.host.models.checkpoint import (
    AttentionWeights,
    DecoderWeights,
    LayerWeights,
    MlpWeights,
)
from vllm_tt_platform.host.models.config import DecoderConfig
from vllm_tt_platform.host.models.paged_kv import LaneKV
from vllm_tt_platform.host.models.rope import RotaryEmbedding


class HostDecoder:
    def __init__(self, config: DecoderConfig, weights: DecoderWeights) -> None:
        self.config = config
        self.weights = weights
        self.rotary = RotaryEmbedding.of(config.rope, config.head_dim)

    @torch.no_grad()
    def prefill(
        self,
        new_tokens: torch.Tensor,
        start: int,
        bucket: int,
        page_row: torch.Tensor,
        lane_kv: LaneKV,
        all_positions: bool = False,
    ) -> torch.Tensor:
        """Run one row's tokens ``new_tokens [n]`` at positions ``[start, start+n)``, padded to
        ``bucket`` positions, attending to ``[0, start+n)``; return the logits ``[V]`` after
        the last real token, or ``[n, V]`` after each real token with ``all_positions`` (prompt
        logprobs). Only the ``n`` real positions write KV."""
        n = new_tokens.shape[0]
        end = start + n
        positions = start + torch.arange(bucket)
        ids = F.pad(new_tokens.long(), (0, bucket - n))
        size = paged_kv.block_size(lane_kv)
        pages, offsets = paged_kv.locate(page_row[None].expand(n, -1), positions[:n], size)
        pages_used = page_row[None, : math.ceil(end / size)]
        key_pos = torch.arange(pages_used.shape[1] * size)
        mask = (key_pos[None, :] <= positions[:, None]) & (key_pos[None, :] < end)

        x = self.weights.embed[ids]
        for layer, (k_cache, v_cache) in zip(self.weights.layers, lane_kv, strict=True):
            q, k, v = self._qkv(_rms_norm(x, layer.input_norm, self.config), layer, positions)
            paged_kv.write(k_cache, pages, offsets, k[:n])
            paged_kv.write(v_cache, pages, offsets, v[:n])
            keys = paged_kv.gather(k_cache, pages_used)
            values = paged_kv.gather(v_cache, pages_used)
            out = self._attend(q.transpose(0, 1)[None], keys, values, mask[None, None])
            x = self._finish_layer(x, out[0].transpose(0, 1), layer)
        if all_positions:
            return self._logits(x[:n])
        return self._logits(x[n - 1 : n])[0]

    @torch.no_grad()
    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        page_table: torch.Tensor,
        kv: list[LaneKV],
        rows_per_lane: int,
    ) -> torch.Tensor:
        """One token per row: ``tokens [B]`` at ``positions [B]`` (-1 = padding row: no KV
        write, output meaningless). Row ``r`` uses lane ``r // rows_per_lane``. Returns ``[B, V]``."""
        batch = tokens.shape[0]
        live = positions >= 0
        pos = positions.clamp(min=0).long()
        size = paged_kv.block_size(kv[0])
        pages, offsets = paged_kv.locate(page_table, pos, size)
        pages_used = page_table[:, : math.ceil((int(pos.max()) + 1) / size)]
        # Padding rows attend to key 0 only, which keeps their (ignored) output finite.
        mask = torch.arange(pages_used.shape[1] * size)[None, :] <= pos[:, None]
        lanes = [slice(i, i + rows_per_lane) for i in range(0, batch, rows_per_lane)]

        x = self.weights.embed[tokens.long()]
        for index, layer in enumerate(self.weights.layers):
            q, k, v = self._qkv(_rms_norm(x, layer.input_norm, self.config), layer, pos)
            keys, values = [], []
            for lane, rows in enumerate(lanes):
                k_cache, v_cache = kv[lane][index]
                write = live[rows]
                paged_kv.write(k_cache, pages[rows][write], offsets[rows][write], k[rows][write])
                paged_kv.write(v_cache, pages[rows][write], offsets[rows][write], v[rows][write])
                keys.append(paged_kv.gather(k_cache, pages_used[rows]))
                values.append(paged_kv.gather(v_cache, pages_used[rows]))
            out = self._attend(q[:, :, None, :], torch.cat(keys), torch.cat(values), mask[:, None, None, :])
            x = self._finish_layer(x, out[:, :, 0, :], layer)
        return self._logits(x)

    def _qkv(
        self, h: torch.Tensor, layer: LayerWeights, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project ``h [T, H]`` to rotated q ``[T, heads, d]`` and k, v ``[T, kv_heads, d]``."""
        a: AttentionWeights = layer.attention
        cfg = self.config
        tokens = h.shape[0]
        q = F.linear(h, a.q, a.q_bias).view(tokens, cfg.num_heads, cfg.head_dim)
        k = F.linear(h, a.k, a.k_bias).view(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = F.linear(h, a.v, a.v_bias).view(tokens, cfg.num_kv_heads, cfg.head_dim)
        if a.q_norm is not None and a.k_norm is not None:
            q = _rms_norm(q, a.q_norm, cfg)
            k = _rms_norm(k, a.k_norm, cfg)
        return self.rotary.rotate(q, positions), self.rotary.rotate(k, positions), v

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Grouped-query attention: ``q [B, heads, Tq, d]`` over ``[B, kv_heads, Tk, d]``."""
        groups = self.config.kv_groups
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=self.config.head_dim**-0.5
        )

    def _finish_layer(self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        """Output projection and MLP, each with its residual; ``attn`` is ``[T, heads, d]``."""
        a = layer.attention
        x = x + F.linear(attn.reshape(x.shape[0], -1), a.o, a.o_bias)
        return x + _mlp(_rms_norm(x, layer.post_attention_norm, self.config), layer.mlp)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_rms_norm(x, self.weights.norm, self.config), self.weights.lm_head)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, config: DecoderConfig) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + config.rms_norm_eps))


def _mlp(x: torch.Tensor, m: MlpWeights) -> torch.Tensor:
    gate = F.silu(F.linear(x, m.gate, m.gate_bias))
    return F.linear(gate * F.linear(x, m.up, m.up_bias), m.down, m.down_bias)
