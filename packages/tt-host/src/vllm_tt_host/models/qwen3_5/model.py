"""Qwen 3.5 text (``Qwen3_5ForCausalLM``) on the host: gated delta-net layers over a per-request
recurrent state, interleaved with gated full-attention layers over the paged KV cache.

The model declares both KV kinds to vLLM (``get_kv_cache_spec``): ``FullAttentionSpec`` for the
attention layers and ``MambaSpec`` for the delta-net layers, whose one block per request holds
its convolution window and delta-rule state (``gated_delta``). vLLM's hybrid KV manager keeps a
block table per group; the runner passes them as ``page_tables_per_layer``, a delta-net layer's
row holding the step's two state blocks: entry 0 the state the step starts from, entry 1 where
the state after the step goes (the same block without prefix caching). With prefix caching on,
vLLM's ``align`` mode gives each request a state block per ``block_size`` tokens, so the state
at every block boundary a step ends on stays cached for a later prompt with that prefix (the
runner picks the two blocks, ``KVGroup.state_blocks``).

Speculative decoding (prefix caching off: vLLM's ``none`` mode) gives each request ``1 + K``
state blocks (``num_speculative_blocks``), a ring by position the runner resolves: a verify
step's row holds the block to read, then one block per position, where the state after that
position goes (``verify_tables``). A rejected draft thus never reaches the state the next step
reads: it starts from the block of the last position vLLM kept, as a device keeps one state
slot per verify position instead of rolling the state back.

What differs from the Llama-style layers: the attention ``q_proj`` gives ``[q | gate]`` per head
and the output is multiplied by ``sigmoid(gate)`` before ``o_proj``; rope covers the first
``rotary_dim`` of each head; the layer, q/k and final norms scale by ``1 + w`` (folded into the
weights at load), the delta-net's gated norm by ``w`` times ``silu(z)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.checkpoint import (
    AttentionWeights,
    DecoderWeights,
    MlpWeights,
    WeightFolder,
    check_shapes,
)
from vllm_tt_host.models.frame.config import DecoderConfig
from vllm_tt_host.models.frame.decoder import (
    DecodeRows,
    HostDecoder,
    PrefillInserts,
    add_after_layer,
    insert_embeddings,
)
from vllm_tt_host.models.frame.hybrid_kv import HybridKVCausalLM, layer_name
from vllm_tt_host.models.frame.inputs import check_kv_shape
from vllm_tt_host.models.frame.mlp import gated_mlp
from vllm_tt_host.models.frame.mtp import MtpModule
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope import RotaryEmbedding
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.qwen3_5.config import Qwen3_5Config
from vllm_tt_host.models.qwen3_5.gated_delta import (
    RecurrentState,
    causal_conv,
    gated_delta_rule,
    l2_normalize,
)

LaneCache = list[Any]
"""One lane's cache: per layer, ``[K, V]`` (attention) or a ``RecurrentState`` (delta-net)."""


@dataclass(frozen=True)
class GatedDeltaWeights:
    in_qkv: torch.Tensor
    """``[2 * key_dim + value_dim, hidden]``: q, k and v before the convolution."""
    in_z: torch.Tensor
    in_b: torch.Tensor
    in_a: torch.Tensor
    conv: torch.Tensor
    """``[conv_dim, kernel]``."""
    dt_bias: torch.Tensor
    neg_a: torch.Tensor
    """``-exp(A_log)``: the per-head decay rate."""
    norm: torch.Tensor
    out: torch.Tensor


@dataclass(frozen=True)
class Qwen3_5Layer:
    input_norm: torch.Tensor
    mixer: AttentionWeights | GatedDeltaWeights
    """Full attention (``q`` holds ``[q | gate]`` per head) or a gated delta-net."""
    post_attention_norm: torch.Tensor
    mlp: MlpWeights


class Qwen3_5Decoder(HostDecoder):
    @classmethod
    def load(cls, folder: Path, config: Qwen3_5Config) -> HostDecoder:
        return load_qwen3_5(folder, config)

    def __init__(self, config: Qwen3_5Config, embed: torch.Tensor, layers: tuple[Qwen3_5Layer, ...],
                 norm: torch.Tensor, lm_head: torch.Tensor, mtp: MtpModule | None = None) -> None:
        super().__init__(config, DecoderWeights(embed=embed, layers=(), norm=norm, lm_head=lm_head))
        self.qwen = config
        self.layers = layers
        self.rotary = RotaryEmbedding.of(config.rope, config.rotary_dim)
        self.mtp = mtp

    def _prefill_layers(self, new_tokens: torch.Tensor, start: int, bucket: int, page_rows: Sequence[torch.Tensor],
                        lane_kv: Any, inserts: PrefillInserts | None) -> torch.Tensor:
        """The ``n`` real positions only (``bucket`` just names the traced shape: padding would
        advance the state); a delta-net layer continues the state in block ``page_rows[layer][0]``
        (from zeros when ``start`` is 0) and writes it to ``page_rows[layer][1]``. ``inserts``:
        the vision-language model's images."""
        n = new_tokens.shape[0]
        positions = start + torch.arange(n)
        x = insert_embeddings(self._embed(new_tokens.long()), inserts)
        for index, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            if isinstance(layer.mixer, GatedDeltaWeights):
                state: RecurrentState = lane_kv[index]
                read, write = page_rows[index][:1].long(), page_rows[index][1:2].long()
                conv, recurrent = state.read(read, torch.tensor([start == 0]))
                out, conv, recurrent = self._delta(h[None], layer.mixer, conv, recurrent)
                state.write(write, conv, recurrent)
                x = x + out[0]
            else:
                x = x + self._attention_prefill(h, layer.mixer, lane_kv[index], page_rows[index], positions)
            x = add_after_layer(x + gated_mlp(self._norm(x, layer.post_attention_norm), layer.mlp), inserts, index)
        return x

    def _decode_layers(self, x: torch.Tensor, step: DecodeRows, page_tables: Sequence[torch.Tensor],
                       kv: list[Any], per_layer: torch.Tensor | None = None) -> torch.Tensor:
        """A padding row writes no KV or state; a delta-net row reads entry 0, writes entry 1."""
        for index, layer in enumerate(self.layers):
            table = page_tables[index]
            if not isinstance(layer.mixer, GatedDeltaWeights):
                x = self.decode_layer(x, step, index, layer, table, [lane_kv[index] for lane_kv in kv])
                continue
            h = self._norm(x, layer.input_norm)
            out = torch.zeros_like(x)
            for lane, rows in enumerate(step.lanes):
                state: RecurrentState = kv[lane][index]
                read, write, alive = table[rows, 0].long(), table[rows, 1].long(), step.live[rows]
                conv, recurrent = state.read(read, ~alive)
                delta, conv, recurrent = self._delta(h[rows][:, None], layer.mixer, conv, recurrent)
                state.write(write[alive], conv[alive], recurrent[alive])
                out[rows] = delta[:, 0]
            x = x + out
            x = x + gated_mlp(self._norm(x, layer.post_attention_norm), layer.mlp)
        return x

    def decode_layer(self, x: torch.Tensor, step: DecodeRows, index: int, layer: Any, page_table: torch.Tensor,
                     caches: Sequence[Sequence[torch.Tensor]], layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """One gated full-attention ``Qwen3_5Layer`` of a decode step, its KV ``caches`` one
        ``[K, V]`` per lane (the MTP module's block runs through here too)."""
        if not isinstance(layer, Qwen3_5Layer) or not isinstance(layer.mixer, AttentionWeights):
            raise TypeError(f"decode_layer runs a Qwen 3.5 full-attention layer, got {type(layer).__name__}")
        h = self._norm(x, layer.input_norm)
        x = x + self._attention_decode(h, layer.mixer, [list(c) for c in caches], page_table, step)
        return x + gated_mlp(self._norm(x, layer.post_attention_norm), layer.mlp)

    def verify_tables(self, tables: Sequence[torch.Tensor], j: int) -> list[torch.Tensor]:
        """A delta-net layer's row at verify position ``j`` reads entry ``j`` (entry 0: the
        step's start; else where position ``j - 1`` left its state) and writes entry ``j + 1``."""
        return [table[:, j : j + 2] if self.qwen.linear(i) else table for i, table in enumerate(tables)]

    # ---- gated delta-net ---------------------------------------------------------------

    def _delta(
        self, h: torch.Tensor, w: GatedDeltaWeights, conv: torch.Tensor, recurrent: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h [B, T, hidden]`` from states ``conv``, ``recurrent``; returns the layer output
        ``[B, T, hidden]`` and the advanced states."""
        s = self.qwen.delta
        batch, steps, _ = h.shape
        mixed, conv = causal_conv(F.linear(h, w.in_qkv), conv, w.conv)
        q, k, v = mixed.split((s.key_dim, s.key_dim, s.value_dim), dim=-1)
        repeat = s.num_v_heads // s.num_k_heads
        q = l2_normalize(q.reshape(batch, steps, s.num_k_heads, s.k_head_dim).repeat_interleave(repeat, dim=2))
        k = l2_normalize(k.reshape(batch, steps, s.num_k_heads, s.k_head_dim).repeat_interleave(repeat, dim=2))
        q = q / (s.k_head_dim**0.5)
        v = v.reshape(batch, steps, s.num_v_heads, s.v_head_dim)
        beta = torch.sigmoid(F.linear(h, w.in_b))
        log_decay = w.neg_a * F.softplus(F.linear(h, w.in_a) + w.dt_bias)
        core, recurrent = gated_delta_rule(q, k, v, log_decay, beta, recurrent)
        z = F.linear(h, w.in_z).reshape(batch, steps, s.num_v_heads, s.v_head_dim)
        gated = rms_norm(core, w.norm, self.config.rms_norm_eps) * F.silu(z)
        return F.linear(gated.reshape(batch, steps, -1), w.out), conv, recurrent

    # ---- gated full attention ----------------------------------------------------------

    def _gated_qkv(
        self, h: torch.Tensor, a: AttentionWeights, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated ``q [T, heads, d]``, the output gate ``[T, heads * d]``, rotated ``k`` and
        ``v [T, kv_heads, d]``."""
        cfg = self.config
        tokens, d = h.shape[0], cfg.head_dim
        q_and_gate = F.linear(h, a.q, a.q_bias).view(tokens, cfg.num_heads, 2 * d)
        q, gate = q_and_gate[..., :d], q_and_gate[..., d:].reshape(tokens, -1)
        k = F.linear(h, a.k, a.k_bias).view(tokens, cfg.num_kv_heads, d)
        v = F.linear(h, a.v, a.v_bias).view(tokens, cfg.num_kv_heads, d)
        if a.q_norm is None or a.k_norm is None:
            raise TypeError("Qwen 3.5 attention layers carry q_norm and k_norm")
        return self._rotate(self._norm(q, a.q_norm), positions), gate, self._rotate(self._norm(k, a.k_norm), positions), v

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        r = self.qwen.rotary_dim
        return torch.cat((self.rotary.rotate(x[..., :r], positions), x[..., r:]), dim=-1)

    def _sdpa(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        groups = self.config.kv_groups
        return F.scaled_dot_product_attention(
            q, keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1),
            attn_mask=mask, scale=self.config.head_dim**-0.5,
        )

    def _gated_out(self, attn: torch.Tensor, gate: torch.Tensor, a: AttentionWeights) -> torch.Tensor:
        return F.linear(attn.reshape(gate.shape) * torch.sigmoid(gate), a.o, a.o_bias)

    def _attention_prefill(
        self, h: torch.Tensor, a: AttentionWeights, layer_kv: list[torch.Tensor], page_row: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        n = h.shape[0]
        q, gate, k, v = self._gated_qkv(h, a, positions)
        k_cache, v_cache = layer_kv
        size = paged_kv.tokens_per_block(k_cache)
        pages, offsets = paged_kv.locate(page_row[None].expand(n, -1), positions, size)
        paged_kv.write(k_cache, pages, offsets, k)
        paged_kv.write(v_cache, pages, offsets, v)
        used = math.ceil((int(positions[-1]) + 1) / size)
        pages_used, key_pos = paged_kv.key_span(page_row[None], torch.zeros(1, dtype=torch.long), used, size)
        mask = paged_kv.visible(key_pos, positions[None], None)
        out = self._sdpa(q.transpose(0, 1)[None], paged_kv.gather(k_cache, pages_used),
                         paged_kv.gather(v_cache, pages_used), mask[:, None])
        return self._gated_out(out[0].transpose(0, 1), gate, a)

    def _attention_decode(
        self, h: torch.Tensor, a: AttentionWeights, lane_kvs: list[list[torch.Tensor]], table: torch.Tensor,
        step: DecodeRows,
    ) -> torch.Tensor:
        pos, live, size = step.pos, step.live, paged_kv.tokens_per_block(lane_kvs[0][0])
        first = torch.zeros_like(pos)
        pages_used, key_pos = paged_kv.key_span(table, first, int((pos // size).max()) + 1, size)
        mask = paged_kv.visible(key_pos, pos[:, None], None)
        pages, offsets = paged_kv.locate(table, pos, size)
        q, gate, k, v = self._gated_qkv(h, a, pos)
        keys, values = [], []
        for (k_cache, v_cache), rows in zip(lane_kvs, step.lanes, strict=True):
            write = live[rows]
            paged_kv.write(k_cache, pages[rows][write], offsets[rows][write], k[rows][write])
            paged_kv.write(v_cache, pages[rows][write], offsets[rows][write], v[rows][write])
            keys.append(paged_kv.gather(k_cache, pages_used[rows]))
            values.append(paged_kv.gather(v_cache, pages_used[rows]))
        out = self._sdpa(q[:, :, None, :], torch.cat(keys), torch.cat(values), mask[:, None])
        return self._gated_out(out[:, :, 0, :], gate, a)


class HostQwen3_5ForCausalLM(HybridKVCausalLM):
    """Qwen 3.5 text (``Qwen3_5ForCausalLM``), float32: delta-net layers over a recurrent state
    (``MambaSpec`` blocks: with prefix caching one per KV block, vLLM's align mode, else one per
    request, ``1 + K`` with speculative decoding) and gated full-attention layers (paged KV); its
    MTP module (``mtp.*``) drafts for ``method: mtp``."""

    family: ClassVar[str] = "qwen3_5"
    model_capabilities: ClassVar[dict[str, Any]] = {
        **HybridKVCausalLM.model_capabilities,
        "kv_cache_kinds": ["full_attention", "recurrent_state"],
        "single_program_lanes": False,
        "supports_mtp": True,
    }
    config_type: ClassVar[type[DecoderConfig]] = Qwen3_5Config
    decoder_type: ClassVar[type[HostDecoder]] = Qwen3_5Decoder

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any]:
        """``FullAttentionSpec`` per attention layer; ``MambaSpec`` per delta-net layer in
        vLLM's cache mode: ``align`` (prefix caching on) a state block per ``mamba_block_size``
        tokens, ``none`` one block per request spanning ``max_model_len``, plus one per draft
        with speculative decoding (the verify step's state slots)."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

        config = _qwen(cls.decoder_config(vllm_config.model_config.hf_config))
        dtype = vllm_config.model_config.dtype
        cache = vllm_config.cache_config
        full = FullAttentionSpec(block_size=cache.block_size, num_kv_heads=config.num_kv_heads,
                                 head_size=config.head_dim, dtype=dtype)
        align = cache.mamba_cache_mode == "align"
        spec = getattr(vllm_config, "speculative_config", None)  # absent from bare test configs
        state = MambaSpec(
            block_size=cache.mamba_block_size if align else vllm_config.model_config.max_model_len,
            shapes=(config.delta.conv_state_shape, config.delta.recurrent_state_shape),
            dtypes=(dtype, dtype),
            mamba_cache_mode=cache.mamba_cache_mode,
            num_speculative_blocks=0 if spec is None else int(spec.num_speculative_tokens),
        )
        return {layer_name(i): state if config.linear(i) else full for i in range(config.num_layers)}

    def allocate_kv_cache_per_layer(self, per_layer_specs: Sequence[Any]) -> list[LaneCache]:
        """Per lane and layer: ``[K, V]`` (float32, all KV heads; attention layers with the same
        ``tensor_idx`` share them) or a zeroed ``RecurrentState`` for a delta-net layer, whose
        spec entry is ``((num_blocks, *conv_shape), (num_blocks, *state_shape))``. Each kind
        gets its own storage (vLLM overlays them in one pool; block ids never collide)."""
        cfg = _qwen(self.config)
        if len(per_layer_specs) != cfg.num_layers:
            raise HostModelInputError(
                f"allocate_kv_cache_per_layer got {len(per_layer_specs)} layer specs, the model has {cfg.num_layers}"
            )
        states = (cfg.delta.conv_state_shape, cfg.delta.recurrent_state_shape)
        attention: dict[int, tuple[int, int, int, int]] = {}
        layout: list[tuple[int, ...] | int] = []
        for layer, (shape, _dtype, tensor_idx) in enumerate(per_layer_specs):
            if cfg.linear(layer):
                got = tuple(tuple(int(v) for v in s) for s in shape)
                if len(got) != 2 or tuple(s[1:] for s in got) != states or got[0][0] != got[1][0]:
                    raise HostModelInputError(
                        f"layer {layer} is a delta-net layer: expected state shapes (num_blocks, *s) for s in "
                        f"{states}, got {got}"
                    )
                layout.append((got[0][0],))
                continue
            num_blocks, block_size = check_kv_shape(tuple(shape), cfg.num_layers, cfg, layer)
            attention.setdefault(int(tensor_idx), (num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim))
            layout.append(int(tensor_idx))
        return [self._lane(layout, attention, states) for _ in range(self.lanes.count)]

    @staticmethod
    def _lane(layout: list[tuple[int, ...] | int], attention: dict[int, tuple[int, int, int, int]],
              states: tuple[tuple[int, int], tuple[int, int, int]]) -> LaneCache:
        tensors = {idx: [torch.zeros(shape), torch.zeros(shape)] for idx, shape in attention.items()}
        return [
            RecurrentState.zeros(entry[0], *states) if isinstance(entry, tuple) else list(tensors[entry])
            for entry in layout
        ]


def _qwen(config: DecoderConfig) -> Qwen3_5Config:
    if not isinstance(config, Qwen3_5Config):
        raise TypeError(f"the Qwen 3.5 host model needs a Qwen3_5Config, got {type(config).__name__}")
    return config


def load_qwen3_5(folder: Path, config: Qwen3_5Config, prefix: str = "model.") -> Qwen3_5Decoder:
    """Every tensor of ``config`` from ``folder`` as float32, under transformers' names; the
    ``1 + w`` norms are folded into their weights here. With ``mtp_num_hidden_layers`` the MTP
    module too, under vLLM's ``qwen3_5_mtp`` names (``mtp.*``), when the checkpoint ships it."""
    weights = WeightFolder(folder)
    layers = tuple(_load_layer(weights, config, f"{prefix}layers.{i}.", config.linear(i))
                   for i in range(config.num_layers))
    embed = weights.tensor(prefix + "embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else weights.tensor("lm_head.weight")
    _check_shapes(folder, config, embed, layers)
    mtp = _load_mtp(weights, config, embed, lm_head) if config.mtp_layers else None
    return Qwen3_5Decoder(config, embed, layers, _plus_one(weights, prefix + "norm.weight"), lm_head, mtp)


def _plus_one(weights: WeightFolder, name: str) -> torch.Tensor:
    return 1.0 + weights.tensor(name)


def _load_layer(weights: WeightFolder, config: Qwen3_5Config, p: str, linear: bool) -> Qwen3_5Layer:
    """The decoder layer under ``p`` (``model.layers.{i}.``, the MTP block's ``mtp.layers.0.``)."""
    get = weights.tensor
    bias = config.qkv_bias
    mixer: AttentionWeights | GatedDeltaWeights
    if linear:
        d = p + "linear_attn."
        mixer = GatedDeltaWeights(
            in_qkv=get(d + "in_proj_qkv.weight"), in_z=get(d + "in_proj_z.weight"),
            in_b=get(d + "in_proj_b.weight"), in_a=get(d + "in_proj_a.weight"),
            conv=get(d + "conv1d.weight").squeeze(1), dt_bias=get(d + "dt_bias"),
            neg_a=-get(d + "A_log").exp(), norm=get(d + "norm.weight"), out=get(d + "out_proj.weight"),
        )
    else:
        a = p + "self_attn."
        mixer = AttentionWeights(
            q=get(a + "q_proj.weight"), k=get(a + "k_proj.weight"), v=get(a + "v_proj.weight"),
            o=get(a + "o_proj.weight"),
            q_bias=get(a + "q_proj.bias") if bias else None, k_bias=get(a + "k_proj.bias") if bias else None,
            v_bias=get(a + "v_proj.bias") if bias else None, o_bias=get(a + "o_proj.bias") if bias else None,
            q_norm=_plus_one(weights, a + "q_norm.weight"), k_norm=_plus_one(weights, a + "k_norm.weight"),
        )
    m = p + "mlp."
    return Qwen3_5Layer(
        input_norm=_plus_one(weights, p + "input_layernorm.weight"),
        mixer=mixer,
        post_attention_norm=_plus_one(weights, p + "post_attention_layernorm.weight"),
        mlp=MlpWeights(gate=get(m + "gate_proj.weight"), up=get(m + "up_proj.weight"),
                       down=get(m + "down_proj.weight"), gate_bias=None, up_bias=None, down_bias=None),
    )


def _load_mtp(weights: WeightFolder, config: Qwen3_5Config, embed: torch.Tensor,
              lm_head: torch.Tensor) -> MtpModule | None:
    """vLLM's ``qwen3_5_mtp``: ``mtp.fc`` over ``[pre_fc_norm_embedding(embedding),
    pre_fc_norm_hidden(hidden)]``, one full-attention layer ``mtp.layers.0``, ``mtp.norm``; the
    target's embedding and LM head. None when the checkpoint ships no ``mtp.*`` weights
    (``method: mtp`` is then refused at startup)."""
    if "mtp.fc.weight" not in weights:
        return None
    module = MtpModule(
        index=config.num_layers, embed=embed,
        enorm=_plus_one(weights, "mtp.pre_fc_norm_embedding.weight"),
        hnorm=_plus_one(weights, "mtp.pre_fc_norm_hidden.weight"), eh_proj=weights.tensor("mtp.fc.weight"),
        block=_load_layer(weights, config, "mtp.layers.0.", linear=False), norm=_plus_one(weights, "mtp.norm.weight"),
        head=lm_head, embeds_position_zero=True,
    )
    h = config.hidden_size
    check_shapes({"mtp.fc.weight": (module.eh_proj, (h, 2 * h))}, weights.folder)
    return module


def _check_shapes(folder: Path, config: Qwen3_5Config, embed: torch.Tensor, layers: tuple[Qwen3_5Layer, ...]) -> None:
    h, s = config.hidden_size, config.delta
    expected: dict[str, tuple[torch.Tensor, tuple[int, ...]]] = {
        "embed_tokens.weight": (embed, (config.vocab_size, h)),
    }
    for i, layer in enumerate(layers):
        if isinstance(layer.mixer, GatedDeltaWeights):
            expected[f"layers.{i}.linear_attn.in_proj_qkv.weight"] = (layer.mixer.in_qkv, (s.conv_dim, h))
            expected[f"layers.{i}.linear_attn.conv1d.weight"] = (layer.mixer.conv, (s.conv_dim, s.conv_kernel))
            expected[f"layers.{i}.linear_attn.out_proj.weight"] = (layer.mixer.out, (h, s.value_dim))
        else:
            width = config.num_heads * config.head_dim
            expected[f"layers.{i}.self_attn.q_proj.weight"] = (layer.mixer.q, (2 * width, h))
            expected[f"layers.{i}.self_attn.k_proj.weight"] = (
                layer.mixer.k, (config.num_kv_heads * config.head_dim, h))
        expected[f"layers.{i}.mlp.up_proj.weight"] = (layer.mlp.up, (config.intermediate_size, h))
    check_shapes(expected, folder)
