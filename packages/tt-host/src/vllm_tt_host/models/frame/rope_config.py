"""``RopeConfig`` and ``read_rope``: the one reader of a checkpoint's rotary parameters.

Transformers 5 keeps them in ``rope_parameters`` (one set for all layers, or one per layer type);
older configs in ``rope_theta`` plus ``rope_scaling`` (and ``rope_local_base_freq`` for Gemma 3's
sliding layers). Every family reads them here, naming the rope types its math implements;
anything else is refused by name instead of producing silently wrong logits later. The
arithmetic of the frequencies is in ``rope`` and ``yarn``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3", "yarn", "proportional")
"""Every rope type the host math implements; each family allows some of them."""

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN's parameters as ``rope_parameters`` names them (HF defaults where optional)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    """Round the ramp's ends to whole dimensions (HF's default; GPT-OSS turns it off)."""
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    @classmethod
    def from_rope_parameters(
        cls, params: Mapping[str, Any], max_position_embeddings: int, model: str
    ) -> YarnScaling:
        original = params.get("original_max_position_embeddings")
        if not isinstance(original, int) or original <= 0:
            raise TTConfigError(
                f"{model}: rope_parameters.original_max_position_embeddings",
                original,
                "a positive int (YaRN needs the pre-training context)",
                "add it to the checkpoint's rope_parameters",
            )
        factor = params.get("factor")
        return cls(
            factor=float(factor) if factor is not None else max_position_embeddings / original,
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=_optional_float(params.get("attention_factor")),
            mscale=_optional_float(params.get("mscale")),
            mscale_all_dim=_optional_float(params.get("mscale_all_dim")),
        )

    @property
    def cos_sin_scale(self) -> float:
        """The factor on cos and sin: given, or from ``mscale`` / ``mscale_all_dim``, or
        ``0.1 ln(factor) + 1``."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return _mscale(self.factor, self.mscale) / _mscale(self.factor, self.mscale_all_dim)
        return _mscale(self.factor)

    @property
    def softmax_scale_factor(self) -> float:
        """DeepSeek's correction of the attention scale: ``mscale(factor, mscale_all_dim)``
        squared (1 without ``mscale_all_dim``)."""
        return _mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; the llama3 fields are only read when ``rope_type`` is llama3."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rotary_fraction: float = 1.0
    """``partial_rotary_factor``: the share of each head that rotates."""
    yarn: YarnScaling | None = None
    """YaRN's parameters when ``rope_type`` is yarn."""


def read_rope(
    hf_config: Any,
    model: str,
    allowed: tuple[str, ...],
    *,
    layer_type: str | None = None,
    theta: float | None = 10_000.0,
    partial: float | None = None,
    max_positions: int = 0,
) -> RopeConfig:
    """The rope set of ``layer_type`` (None: the one set for every layer) when its type is one
    of ``allowed``. ``theta`` is the base when the config names none (None: it must name one);
    ``partial`` is the share of the head that rotates when the config does not say, for a
    family that rotates part of a head (None: the whole head rotates, another share is refused)."""
    unknown = [t for t in allowed if t not in ROPE_TYPES]
    if unknown:
        raise ValueError(f"rope types {unknown} are not implemented by the host math ({', '.join(ROPE_TYPES)})")
    where, params = _rope_set(hf_config, model, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in allowed:
        raise TTUnsupportedFeatureError(
            f"{model}: {where}rope_type", rope_type, f"one of {', '.join(allowed)}",
            f"serve this model with a ttnn mesh, or a checkpoint with {'/'.join(allowed)} rope",
        )
    if params.get("rope_theta") is None and theta is None:
        raise TTConfigError(
            f"{model}: {where or 'rope_parameters'}", dict(params), "a rope set with rope_theta",
            "check the checkpoint's config.json",
        )
    base = float(params.get("rope_theta") or theta or 0.0)
    fraction = _rotary_fraction(hf_config, params, model, where, partial)
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_KEYS if k not in params]
        if missing:
            raise TTConfigError(
                f"{model}: {where or 'rope_parameters'}", dict(params), f"llama3 rope with {', '.join(LLAMA3_KEYS)}",
                f"add {', '.join(missing)} to the checkpoint's rope parameters",
            )
        return RopeConfig(
            theta=base, rope_type="llama3", factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
            rotary_fraction=fraction,
        )
    if rope_type == "yarn":
        yarn = YarnScaling.from_rope_parameters(params, max_positions, model)
        return RopeConfig(
            theta=base, rope_type="yarn", factor=yarn.factor,
            original_max_position_embeddings=yarn.original_max_position_embeddings, rotary_fraction=fraction,
            yarn=yarn,
        )
    factor = float(params.get("factor", 1.0)) if rope_type in ("linear", "proportional") else 1.0
    return RopeConfig(theta=base, rope_type=rope_type, factor=factor, rotary_fraction=fraction)


def _rope_set(hf_config: Any, model: str, layer_type: str | None) -> tuple[str, Mapping[str, Any]]:
    """``(where, parameters)``: where names the set in errors (``""`` for the one set)."""
    found = getattr(hf_config, "rope_parameters", None)
    params: Mapping[str, Any] | None = found if isinstance(found, Mapping) else None
    per_type = bool(params) and params is not None and "rope_theta" not in params and all(
        isinstance(v, Mapping) for v in params.values()
    )
    if layer_type is None:
        if per_type and params is not None:
            raise TTUnsupportedFeatureError(
                f"{model}: rope_parameters", dict(params), "one set for all layers",
                "host reference models use one rotary embedding for every layer of this family",
            )
        if params is not None:
            return "", params
        legacy = dict(getattr(hf_config, "rope_scaling", None) or {})
        legacy.setdefault("rope_theta", getattr(hf_config, "rope_theta", None))
        return "", legacy
    if per_type and params is not None and isinstance(params.get(layer_type), Mapping):
        return f"rope_parameters[{layer_type!r}].", params[layer_type]
    if layer_type == "sliding_attention":
        return "rope_local_base_freq/", {"rope_theta": getattr(hf_config, "rope_local_base_freq", None)}
    scaling = dict(getattr(hf_config, "rope_scaling", None) or {})
    return "rope_scaling.", {**scaling, "rope_theta": getattr(hf_config, "rope_theta", None)}


def _rotary_fraction(hf_config: Any, params: Mapping[str, Any], model: str, where: str, partial: float | None) -> float:
    value = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    fraction = float(value) if value is not None else (partial or 1.0)
    if partial is None and fraction != 1.0:
        raise TTUnsupportedFeatureError(
            f"{model}: {where}partial_rotary_factor", fraction, "1.0", "host reference models rotate the whole head",
        )
    if not 0.0 < fraction <= 1.0:
        raise TTConfigError(f"{model}: {where}partial_rotary_factor", fraction, "(0, 1]", "check config.json")
    return fraction


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
