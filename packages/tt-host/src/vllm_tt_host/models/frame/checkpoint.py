"""Load an HF checkpoint folder (``*.safetensors``, sharded or not) into typed float32 weights.

Host models read the same files the real device models read: the folder named by
``hf_config._name_or_path``, or its snapshot in the local Hugging Face cache. Nothing is
downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_tt_host.models.frame.config import DecoderConfig


class CheckpointError(RuntimeError):
    """The checkpoint folder is missing, lacks a tensor the config needs, or does not match it."""


@dataclass(frozen=True)
class AttentionWeights:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    """Per-head RMSNorm weight (Qwen 3), applied to q before rotation."""
    k_norm: torch.Tensor | None


@dataclass(frozen=True)
class MlpWeights:
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_bias: torch.Tensor | None
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    attention: AttentionWeights
    post_attention_norm: torch.Tensor
    mlp: MlpWeights


@dataclass(frozen=True)
class DecoderWeights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    lm_head: torch.Tensor
    """The embedding itself when ``tie_word_embeddings`` is set."""


def resolve_checkpoint_dir(name_or_path: str) -> Path:
    """The local folder of ``name_or_path``: the path itself, else its snapshot in the local
    Hugging Face cache (looked up offline)."""
    if not name_or_path:
        raise CheckpointError(
            "hf_config._name_or_path is empty: host models load weights from the checkpoint "
            "folder the config came from; load the config with AutoConfig.from_pretrained(path)"
        )
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, local_files_only=True))
    except Exception as exc:  # the hub raises several unrelated types for "not cached"
        raise CheckpointError(
            f"checkpoint {name_or_path!r} is neither a local folder nor in the local Hugging "
            f"Face cache ({type(exc).__name__}); host models never download: pass a folder "
            "holding config.json and *.safetensors"
        ) from exc


def load_decoder_weights(folder: Path, config: DecoderConfig, prefix: str = "model.",
                         lm_head: str = "lm_head.weight") -> DecoderWeights:
    """Read every tensor ``config`` needs from ``folder`` as float32; ``prefix`` is where the
    decoder's tensors sit (a vision-language checkpoint nests them under its language model, and
    may keep its ``lm_head`` there too)."""
    reader = WeightFolder(folder)

    def get(name: str) -> torch.Tensor:
        return reader.tensor(name)

    layers = [load_layer_weights(reader, f"{prefix}layers.{i}.", config) for i in range(config.num_layers)]
    embed = get(prefix + "embed_tokens.weight")
    weights = DecoderWeights(
        embed=embed, layers=tuple(layers), norm=get(prefix + "norm.weight"),
        lm_head=embed if config.tie_word_embeddings else get(lm_head),
    )
    _check_shapes(weights, config, folder)
    return weights


def load_layer_weights(reader: WeightFolder, prefix: str, config: DecoderConfig,
                       attention: str = "self_attn.", qk_norm: bool | None = None) -> LayerWeights:
    """One decoder layer under ``prefix``: norms, the attention module named ``attention``
    (Mllama's cross-attention layers name theirs ``cross_attn.``) and the gated MLP; ``qk_norm``
    (default: the config's) reads per-head q and k norms."""

    def get(name: str) -> torch.Tensor:
        return reader.tensor(name)

    def maybe(name: str, wanted: bool) -> torch.Tensor | None:
        return reader.tensor(name) if wanted else None

    attn = prefix + attention
    mlp = prefix + "mlp."
    qk_norm = config.qk_norm if qk_norm is None else qk_norm
    return LayerWeights(
        input_norm=get(prefix + "input_layernorm.weight"),
        attention=AttentionWeights(
            q=get(attn + "q_proj.weight"),
            k=get(attn + "k_proj.weight"),
            v=get(attn + "v_proj.weight"),
            o=get(attn + "o_proj.weight"),
            q_bias=maybe(attn + "q_proj.bias", config.qkv_bias),
            k_bias=maybe(attn + "k_proj.bias", config.qkv_bias),
            v_bias=maybe(attn + "v_proj.bias", config.qkv_bias),
            o_bias=maybe(attn + "o_proj.bias", config.o_bias),
            q_norm=maybe(attn + "q_norm.weight", qk_norm),
            k_norm=maybe(attn + "k_norm.weight", qk_norm),
        ),
        post_attention_norm=get(prefix + "post_attention_layernorm.weight"),
        mlp=MlpWeights(
            gate=get(mlp + "gate_proj.weight"),
            up=get(mlp + "up_proj.weight"),
            down=get(mlp + "down_proj.weight"),
            gate_bias=maybe(mlp + "gate_proj.bias", config.mlp_bias),
            up_bias=maybe(mlp + "up_proj.bias", config.mlp_bias),
            down_bias=maybe(mlp + "down_proj.bias", config.mlp_bias),
        ),
    )


class WeightFolder:
    """A checkpoint folder's tensors by name, across its safetensors files (sharded or not),
    each read as float32 when asked for."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: folder / file for name, file in weight_map.items()}
        else:
            self._file_of = self._scan(sorted(folder.glob("*.safetensors")))
        if not self._file_of:
            raise CheckpointError(f"no *.safetensors weights in {folder}")
        self._open: dict[Path, Any] = {}

    @staticmethod
    def _scan(files: list[Path]) -> dict[str, Path]:
        from safetensors import safe_open

        found: dict[str, Path] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    found[name] = file
        return found

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def prefix(self, candidates: tuple[str, ...], probe: str, what: str) -> str:
        """The first of ``candidates`` under which ``probe`` is stored: checkpoints of one
        model nest its parts (a text decoder, a vision tower) under different names."""
        for prefix in candidates:
            if prefix + probe in self:
                return prefix
        raise CheckpointError(f"no {what} in {self.folder}: looked for {probe!r} under {', '.join(candidates)}")

    def tensor(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        file = self._file_of.get(name)
        if file is None:
            raise CheckpointError(
                f"tensor {name!r} is missing from the checkpoint in {self.folder}; the config "
                "asks for it (check the architecture and tie_word_embeddings in config.json)"
            )
        if file not in self._open:
            self._open[file] = safe_open(str(file), framework="pt")
        return self._open[file].get_tensor(name).to(torch.float32).contiguous()


def _check_shapes(weights: DecoderWeights, config: DecoderConfig, folder: Path) -> None:
    q_width = config.num_heads * config.head_dim
    kv_width = config.num_kv_heads * config.head_dim
    expected = {
        "model.embed_tokens.weight": (weights.embed, (config.vocab_size, config.hidden_size)),
        "lm_head.weight": (weights.lm_head, (config.vocab_size, config.hidden_size)),
        "self_attn.q_proj.weight": (weights.layers[0].attention.q, (q_width, config.hidden_size)),
        "self_attn.k_proj.weight": (weights.layers[0].attention.k, (kv_width, config.hidden_size)),
        "mlp.up_proj.weight": (
            weights.layers[0].mlp.up,
            (config.intermediate_size, config.hidden_size),
        ),
    }
    check_shapes(expected, folder)


def check_shapes(
    expected: Mapping[str, tuple[torch.Tensor, tuple[int, ...]]], folder: Path, *, implied_by: str = "config.json",
    note: str = "",
) -> None:
    """Refuse weights that do not fit their config: ``expected`` maps a tensor's name to the
    tensor and the shape ``implied_by`` implies (``note``: what else may be wrong)."""
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"{name} in {folder} has shape {tuple(tensor.shape)}, but {implied_by} implies {shape}; "
                f"the weights and config.json do not belong together{note}"
            )
