"""Modelled device time: how long a Tenstorrent mesh takes for each program.

The phase scheduler decides by it (``--additional-config.tt.step_cost``), and the host mesh
backend replays it so host overhead and overlap can be measured without hardware
(``--additional-config.tt.host_device_time``). Two models exist:

* a fixed duration (``"25ms"``): every decode step and every prefill call takes that long;
* a cost model (``"served"``, ``"llama-3.1-8b@N150"``, ...): decode streams the weights and the
  KV it reads from DRAM once per step, prefill is bound by matmul throughput, multi-chip meshes
  pay a collective latency per layer, and a readback (or a KV block copy to or from host
  memory) pays link latency plus bytes / bandwidth.

A mesh split into data-parallel lanes is costed per sub-mesh: each lane runs its own rows on its
own sub-mesh, side by side, so a program over all lanes takes as long as its busiest lane.

The numbers are coarse public figures (see ``CHIPS``); they set the right order of magnitude
(Llama-3.1-8B on an N150 ~ 42 ms per decode step, Llama-3.3-70B on a Galaxy ~ 14 ms), not a
prediction. The chosen durations are in the startup log.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_tt_platform.mesh.shape import MESH_PRESETS, MeshShape, preset_name

SERVED = "served"
"""Model name meaning: the dimensions of the checkpoint being served."""


@dataclass(frozen=True)
class ChipSpec:
    name: str
    dram_bytes_per_s: float
    """Peak DRAM bandwidth of one chip."""
    matmul_flops: float
    """Peak dense block-fp8 matmul throughput of one chip."""


CHIPS: dict[str, ChipSpec] = {
    # Wormhole n150 product sheet: 288 GB/s GDDR6, 148 TFLOPS BLOCKFP8.
    "wormhole": ChipSpec("wormhole", 288e9, 148e12),
    # Blackhole p150 product sheet: 512 GB/s GDDR6, ~387 TFLOPS BLOCKFP8.
    "blackhole": ChipSpec("blackhole", 512e9, 387e12),
}


@dataclass(frozen=True)
class MeshCost:
    """One emulated mesh: its chips plus the efficiencies the cost model applies."""

    chip: ChipSpec
    devices: int
    dram_efficiency: float = 0.7
    """Fraction of peak bandwidth a decode step achieves streaming weights."""
    matmul_efficiency: float = 0.5
    """Fraction of peak matmul throughput a prefill achieves."""
    program_overhead_s: float = 50e-6
    """Dispatch of one traced program."""
    collective_s_per_layer: float = 30e-6
    """Two all-reduces per layer on a multi-chip mesh (0 on one chip)."""
    link_latency_s: float = 30e-6
    """Device-to-host readback latency."""
    link_bytes_per_s: float = 16e9
    """Device-to-host bandwidth (PCIe)."""

    @classmethod
    def of_mesh(cls, shape: MeshShape, preset: str | None) -> MeshCost:
        """Blackhole for ``P*``/``BH-*`` presets, Wormhole otherwise."""
        name = (preset or "").upper()
        chip = CHIPS["blackhole"] if name.startswith(("P", "BH")) else CHIPS["wormhole"]
        return cls(chip=chip, devices=shape.num_devices)


@dataclass(frozen=True)
class ModelDims:
    """What the cost model needs to know about a decoder-only model."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    weight_bytes_per_param: float = 1.0625
    """bfloat8_b: 8-bit mantissas plus one shared exponent per 16 values."""
    kv_bytes_per_value: float = 1.0625

    @classmethod
    def from_hf(cls, hf_config: Any) -> ModelDims:
        text = getattr(hf_config, "text_config", None) or hf_config
        heads = int(text.num_attention_heads)
        return cls(
            num_layers=int(text.num_hidden_layers),
            hidden_size=int(text.hidden_size),
            intermediate_size=int(text.intermediate_size),
            num_heads=heads,
            num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
            vocab_size=int(text.vocab_size),
            tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
        )

    @property
    def layer_params(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def streamed_params(self) -> int:
        """Parameters read from DRAM once per decode step: every layer and the LM head (the
        embedding table is only indexed)."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> float:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.kv_bytes_per_value


MODEL_PROFILES: dict[str, ModelDims] = {
    "llama-3.1-8b": ModelDims(32, 4096, 14336, 32, 8, 128, 128256),
    "llama-3.3-70b": ModelDims(80, 8192, 28672, 64, 8, 128, 128256),
    "llama-3.2-1b": ModelDims(16, 2048, 8192, 32, 8, 64, 128256, tied_embeddings=True),
    # DeepSeek V3 as the dense model a decode step reads alike: its 37B active parameters of
    # 671B (per layer ~0.61B: MLA projections and 8 + 1 of 256 experts), its latent KV of 576
    # values per token and layer (one 288-wide "head" for K and V).
    "deepseek-v3": ModelDims(61, 7168, 3450, 128, 1, 288, 129280),
    # Pooling models, read alike: BGE-large (BERT-large: 24 layers, a two-matrix FFN of 4096,
    # here the gated width of the same size, 2731) and Qwen3-Embedding-8B, neither with an LM head.
    "bge-large": ModelDims(24, 1024, 2731, 16, 16, 64, 0),
    "qwen3-embedding-8b": ModelDims(36, 4096, 12288, 32, 8, 128, 0),
}
"""Named models to time instead of the served checkpoint (its math still runs, or is skipped)."""


@dataclass(frozen=True)
class ProgramCosts:
    """Resolved durations, in seconds, of the programs one host model submits."""

    fixed_s: float | None = None
    dims: ModelDims | None = None
    mesh: MeshCost | None = None
    description: str = ""

    def with_layers(self, num_layers: int) -> ProgramCosts:
        """The programs of ``num_layers`` of these layers and an own (untied) LM head: a
        model's MTP module (one decoder block and its head) on the same mesh."""
        if self.dims is None:
            return self
        dims = dataclasses.replace(self.dims, num_layers=num_layers, tied_embeddings=False)
        return dataclasses.replace(self, dims=dims, description=f"{self.description}, {num_layers} layer(s) + head")

    def eagle3_head(self, draft_vocab_size: int, aux_states: int) -> ProgramCosts:
        """An EAGLE-3 head's programs on the same mesh: one of these layers, its ``fc`` over
        ``aux_states`` of the target's hidden states and its LM head over ``draft_vocab_size``
        ids (``fc``'s ``[hidden, aux_states * hidden]`` weights read as that many more head rows)."""
        if self.dims is None:
            return self
        dims = dataclasses.replace(self.dims, num_layers=1, tied_embeddings=False,
                                   vocab_size=draft_vocab_size + aux_states * self.dims.hidden_size)
        return dataclasses.replace(self, dims=dims, description=f"{self.description}, 1 layer + fc + "
                                                                 f"{draft_vocab_size}-id head")

    def decode_s(self, context_tokens: int) -> float:
        """One decode step over the batch; ``context_tokens`` = KV positions read, all rows."""
        if self.fixed_s is not None:
            return self.fixed_s
        dims, mesh = self._model()
        streamed = dims.streamed_params * dims.weight_bytes_per_param + context_tokens * dims.kv_bytes_per_token
        bandwidth = mesh.chip.dram_bytes_per_s * mesh.devices * mesh.dram_efficiency
        return mesh.program_overhead_s + streamed / bandwidth + self._collectives_s(dims, mesh)

    def verify_s(self, context_tokens: int, query_tokens: int) -> float:
        """One verify step (speculative decoding): ``query_tokens`` positions over all rows,
        ``context_tokens`` KV positions read. The weights are still read once, so the step
        costs the larger of a decode step's DRAM time and its matmuls at ``query_tokens``."""
        if self.fixed_s is not None:
            return self.fixed_s
        dims, mesh = self._model()
        decode = self.decode_s(context_tokens)
        matmul = 2 * dims.streamed_params * query_tokens / (mesh.chip.matmul_flops * mesh.devices * mesh.matmul_efficiency)
        return max(decode, mesh.program_overhead_s + matmul + self._collectives_s(dims, mesh))

    def mixed_s(self, context_tokens: int, decode_rows: int, chunks: Sequence[tuple[int, int]]) -> float:
        """One mixed step: ``decode_rows`` decode rows reading ``context_tokens`` KV positions
        and prompt ``chunks`` of (tokens, cached tokens before them) in one program. The weights
        are read once for all, so the step costs the larger of a decode step's DRAM time and
        the matmuls of every token with each row's attention (a decode row's query attends to
        its context, a chunk's as in a prefill)."""
        if self.fixed_s is not None:
            return self.fixed_s
        attended = context_tokens + sum(tokens * (start + tokens / 2) for tokens, start in chunks)
        tokens = decode_rows + sum(tokens for tokens, _ in chunks)
        return max(self.decode_s(context_tokens), self._compute_s(tokens, attended))

    def prefill_s(self, tokens: int, start: int) -> float:
        """One prefill row of ``tokens`` new positions after ``start`` cached ones."""
        if self.fixed_s is not None:
            return self.fixed_s
        return self._compute_s(tokens, tokens * (start + tokens / 2))

    def pool_s(self, batch: int, length: int) -> float:
        """One pooling program at shape ``batch x length``: every row runs, padding included
        (a fixed-shape program), each attending within its own row; the program reads the
        weights once, so a small shape costs at least that stream."""
        if self.fixed_s is not None:
            return self.fixed_s
        return max(self.decode_s(0), self._compute_s(batch * length, batch * length * length / 2))

    def _compute_s(self, tokens: int, attended: float) -> float:
        """A matmul-bound program over ``tokens`` positions whose queries attend to
        ``attended`` (query, key) pairs in all."""
        dims, mesh = self._model()
        matmul = 2 * dims.streamed_params * tokens
        attention = 4 * dims.num_layers * dims.num_heads * dims.head_dim * attended
        throughput = mesh.chip.matmul_flops * mesh.devices * mesh.matmul_efficiency
        return mesh.program_overhead_s + (matmul + attention) / throughput + self._collectives_s(dims, mesh)

    def readback_s(self, num_bytes: int) -> float:
        if self.mesh is None:
            return 0.0
        return self.mesh.link_latency_s + num_bytes / self.mesh.link_bytes_per_s

    def kv_transfer_s(self, tokens: float) -> float:
        """Copying the KV of ``tokens`` positions (over all layers; a share of the layers is a
        fraction of a token) between the mesh and host memory, either way: the host link's
        latency plus the bytes, in the device's KV format, over its bandwidth."""
        if self.dims is None or self.mesh is None:
            return 0.0
        return self.readback_s(round(tokens * self.dims.kv_bytes_per_token))

    def _model(self) -> tuple[ModelDims, MeshCost]:
        if self.dims is None or self.mesh is None:
            raise ValueError("ProgramCosts needs a fixed duration or model dims and a mesh")
        return self.dims, self.mesh

    @staticmethod
    def _collectives_s(dims: ModelDims, mesh: MeshCost) -> float:
        return dims.num_layers * mesh.collective_s_per_layer if mesh.devices > 1 else 0.0


@dataclass(frozen=True)
class DeviceTimeSpec:
    """A parsed ``host_device_time`` value, resolved once the model and mesh are known."""

    fixed_s: float | None = None
    model: str | None = None
    """``SERVED`` or a ``MODEL_PROFILES`` name."""
    mesh_preset: str | None = None
    """A ``MESH_PRESETS`` name; None = the opened mesh."""

    def resolve(self, served: ModelDims, shape: MeshShape, preset: str | None, lanes: int = 1) -> ProgramCosts:
        """Costs of one program on one sub-mesh when the mesh is split into ``lanes``: each lane
        runs its own rows on its own sub-mesh, side by side with the others."""
        if self.fixed_s is not None:
            return ProgramCosts(fixed_s=self.fixed_s, description=f"fixed {self.fixed_s * 1e3:g} ms per program")
        dims = served if self.model == SERVED else MODEL_PROFILES[str(self.model)]
        if self.mesh_preset is not None:
            shape, preset = MESH_PRESETS[self.mesh_preset], self.mesh_preset
        where = preset or str(shape)
        if lanes > 1:
            shape = shape.split(lanes)
            where = f"{where} split into {lanes} {shape} sub-meshes, per sub-mesh"
        mesh = MeshCost.of_mesh(shape, preset)
        costs = ProgramCosts(dims=dims, mesh=mesh)
        return ProgramCosts(
            dims=dims, mesh=mesh,
            description=(f"cost model {self.model} on {where} ({mesh.devices} {mesh.chip.name}): "
                         f"decode {costs.decode_s(0) * 1e3:.2f} ms/step + KV, "
                         f"prefill 128 tokens {costs.prefill_s(128, 0) * 1e3:.2f} ms"),
        )


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s)\s*$")
_PER_SECOND = {"us": 1e6, "ms": 1e3, "s": 1.0}

SPEC_FORMS = (
    "a duration such as `25ms`, `800us` or `0.04s` (every program takes that long); "
    f"`{SERVED}` (cost model of the served checkpoint on the MESH_DEVICE mesh); a model profile "
    f"({', '.join(f'`{m}`' for m in MODEL_PROFILES)}); or `<model>@<preset>` to name the mesh "
    "too, e.g. `llama-3.1-8b@N150`, `llama-3.3-70b@TG`"
)


def parse_device_time(text: str) -> DeviceTimeSpec:
    """Parse a ``host_device_time`` value; raises ``ValueError`` naming the accepted forms."""
    duration = _DURATION.match(text)
    if duration:
        return DeviceTimeSpec(fixed_s=float(duration.group(1)) / _PER_SECOND[duration.group(2)])
    model, _, mesh = text.strip().partition("@")
    model = model.strip().lower()
    if model != SERVED and model not in MODEL_PROFILES:
        raise ValueError(f"unknown model {model!r}: use {SPEC_FORMS}")
    preset = None
    if mesh:
        preset = preset_name(mesh)
        if preset is None:
            raise ValueError(f"unknown mesh preset {mesh!r}: use one of {', '.join(MESH_PRESETS)}")
    return DeviceTimeSpec(model=model, mesh_preset=preset)
