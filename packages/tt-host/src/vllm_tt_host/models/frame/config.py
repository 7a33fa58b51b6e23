"""``DecoderConfig``: the few numbers the host decoder needs, read from an HF config.

One parser for the Llama-style families (``FAMILY_FIELDS``: which projections carry a bias,
whether q/k are normalised per head) and the fields every family reads the same way
(``common_fields``). Anything the host math does not implement (sliding
windows, other rope types, other activations) is refused here, by name, instead of producing
silently wrong logits later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.rope_config import RopeConfig, read_rope

FAMILY_FIELDS: dict[str, dict[str, bool]] = {
    "qwen2": {"qkv_bias": True, "o_bias": False},
    "qwen3": {"qk_norm": True},
}
"""What a Llama-style family fixes whatever its config says: Qwen 2 biases q, k and v (never o),
Qwen 3 norms q and k per head. Any other family (Llama, Mistral, a new dense one) biases q, k,
v and o by ``attention_bias`` and norms neither."""

ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
"""The rope types of the Llama-style families."""


@dataclass(frozen=True)
class AttentionShape:
    """Heads, KV heads, head size and layer count: what every family reads the same way."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def read(
        cls, hf_config: Any, *, n_layers: int | None = None, head_dim_required: bool = False
    ) -> AttentionShape:
        """Read and check the shape; ``n_layers`` keeps only the first layers (tt-metal's test
        hook). Without ``head_dim_required`` a missing ``head_dim`` means hidden / heads;
        ``num_key_value_heads`` absent means multi-head attention."""
        model = model_name(hf_config)
        heads = positive_int(hf_config, "num_attention_heads", model)
        kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
        if heads % kv_heads:
            raise TTConfigError(
                f"{model}: num_key_value_heads",
                kv_heads,
                f"a divisor of num_attention_heads={heads}",
                "check the checkpoint's config.json",
            )
        if head_dim_required:
            head_dim = positive_int(hf_config, "head_dim", model)
        else:
            hidden = positive_int(hf_config, "hidden_size", model)
            head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
        if head_dim % 2:
            raise TTConfigError(f"{model}: head_dim", head_dim, "an even number", "check config.json")
        layers = positive_int(hf_config, "num_hidden_layers", model)
        if n_layers is not None:
            if not 0 < n_layers <= layers:
                raise TTConfigError(
                    "n_layers", n_layers, f"1..{layers}", "pass n_layers=None for the full model"
                )
            layers = n_layers
        return cls(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)



def common_fields(
    hf_config: Any, shape: AttentionShape, *, family: str, rope: RopeConfig, qk_norm: bool, mlp_bias: bool = False,
    attention_bias: bool = False, rms_norm_eps: float = 1e-6, tie_word_embeddings: bool = False,
) -> dict[str, Any]:
    """Every ``DecoderConfig`` field: the ones each family reads the same way (sizes, the
    attention shape, norm epsilon, context length, tied embeddings, ``attention_bias`` on q, k, v
    and o) and the family's own (``family``, ``rope``, ``qk_norm``, ``mlp_bias``).
    ``attention_bias``, ``rms_norm_eps`` and ``tie_word_embeddings`` are the family's defaults
    for a config that omits them."""
    model = model_name(hf_config)
    bias = bool(getattr(hf_config, "attention_bias", attention_bias))
    return {
        "family": family,
        "rope": rope,
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": mlp_bias,
        "qk_norm": qk_norm,
        "vocab_size": positive_int(hf_config, "vocab_size", model),
        "hidden_size": positive_int(hf_config, "hidden_size", model),
        "intermediate_size": positive_int(hf_config, "intermediate_size", model),
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "rms_norm_eps": float(getattr(hf_config, "rms_norm_eps", rms_norm_eps)),
        "max_position_embeddings": int(getattr(hf_config, "max_position_embeddings", 0) or 0),
        "tie_word_embeddings": bool(getattr(hf_config, "tie_word_embeddings", tie_word_embeddings)),
    }

@dataclass(frozen=True)
class DecoderConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    layer_windows: tuple[int | None, ...] = ()
    """Per layer: its sliding window (HF's ``sliding_window``), or None for full attention;
    empty means full attention everywhere."""

    @property
    def kv_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``: it attends to ``(p - window, p]``; None = ``[0, p]``."""
        return self.layer_windows[layer] if self.layer_windows else None

    def rope_of(self, layer: int) -> RopeConfig:
        """The rotary parameters of ``layer`` (one set for all layers here; families with
        per-layer-type rope override this)."""
        return self.rope

    def kv_heads_of(self, layer: int) -> int:
        """KV heads of ``layer`` (families whose full and sliding layers differ override this)."""
        return self.num_kv_heads

    def head_dim_of(self, layer: int) -> int:
        """Head size of ``layer``."""
        return self.head_dim

    def kv_source(self, layer: int) -> int:
        """The layer whose KV ``layer`` attends to: itself, unless it reads an earlier layer's
        KV and writes none (Gemma 4's KV-shared layers)."""
        return layer

    @classmethod
    def read(cls, hf_config: Any, family: str, *, n_layers: int | None = None) -> DecoderConfig:
        """Read ``hf_config`` (a transformers config or anything with the same attributes) as
        ``family`` reads it; ``HostCausalLM.decoder_config`` calls the family's ``config_type.read``,
        and a family config with fields of its own overrides it."""
        model = model_name(hf_config)
        _reject_sliding_window(hf_config, model)
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise TTUnsupportedFeatureError(
                f"{model}: hidden_act", act, "silu", "serve this model with a ttnn mesh"
            )
        shape = AttentionShape.read(hf_config, n_layers=n_layers)
        fields = common_fields(
            hf_config, shape, family=family, rope=read_rope(hf_config, model, ROPE_TYPES), qk_norm=False,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
        )
        return cls(**fields | FAMILY_FIELDS.get(family, {}))


def model_name(hf_config: Any) -> str:
    return str(getattr(hf_config, "_name_or_path", "") or type(hf_config).__name__)


def positive_int(hf_config: Any, name: str, model: str) -> int:
    value = getattr(hf_config, name, None)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TTConfigError(f"{model}: {name}", value, "a positive int", "check the checkpoint's config.json")
    return value


def mtp_modules(hf_config: Any, model: str, field: str) -> int:
    """The MTP modules ``field`` declares (DeepSeek V3's ``num_nextn_predict_layers``, Qwen
    3.5's ``mtp_num_hidden_layers``): 0 or 1, the host serving one (``frame.mtp``)."""
    count = getattr(hf_config, field, 0) or 0
    if isinstance(count, bool) or not isinstance(count, int) or count not in (0, 1):
        raise TTUnsupportedFeatureError(
            f"{model}: {field}", count, "0 or 1 (one MTP module after the last layer)",
            f"set {field} to 1 (the host serves the first MTP module) or 0 in config.json",
        )
    return count


def refuse_unimplemented(hf_config: Any, model: str, refused: Mapping[str, tuple[str, str]]) -> None:
    """Refuse each field of ``refused`` the config sets (to anything truthy): the family's host
    math does not implement it. ``refused``: field -> (the value the host serves, the fix)."""
    for name, (served, fix) in refused.items():
        value = getattr(hf_config, name, None)
        if value:
            raise TTUnsupportedFeatureError(f"{model}: {name}", value, served, fix)


def vision_activation(hf_vision: Any, model: str, implemented: tuple[str, ...]) -> str:
    """``vision_config.hidden_act``, when it is one the host vision tower ``implemented``."""
    act = getattr(hf_vision, "hidden_act", None)
    if act not in implemented:
        raise TTUnsupportedFeatureError(
            f"{model}: vision_config.hidden_act", act, ", ".join(implemented), "serve this model with a ttnn mesh",
        )
    return str(act)


LAYER_TYPES: tuple[str, ...] = ("sliding_attention", "full_attention")
"""The ``layer_types`` entries hybrid-KV families (Gemma 3, GPT-OSS) serve."""


def layer_windows(hf_config: Any, model: str, layers: int) -> tuple[int | None, ...]:
    """The sliding window of each of the first ``layers`` layers (None = full attention), from
    ``layer_types`` and ``sliding_window``."""
    types = list(getattr(hf_config, "layer_types", None) or [])
    if len(types) < layers or any(t not in LAYER_TYPES for t in types):
        raise TTConfigError(
            f"{model}: layer_types", types, f"{layers} entries, each one of {', '.join(LAYER_TYPES)}",
            "load the config with transformers >= 5 (it fills layer_types in)",
        )
    window = getattr(hf_config, "sliding_window", None)
    if "sliding_attention" in types[:layers] and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise TTConfigError(
            f"{model}: sliding_window", window, "a positive int", "check the checkpoint's config.json"
        )
    return tuple(window if t == "sliding_attention" else None for t in types[:layers])


def _reject_sliding_window(hf_config: Any, model: str) -> None:
    """Host attention is full attention; a window would make it silently wrong past the window."""
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:
        active = any(t != "full_attention" for t in layer_types)
    else:
        active = window is not None and getattr(hf_config, "use_sliding_window", True) is not False
    if active:
        raise TTUnsupportedFeatureError(
            f"{model}: sliding_window",
            window,
            "null (full attention on every layer)",
            "host reference models implement full attention only; use a checkpoint whose "
            'config.json has "sliding_window": null (e.g. Mistral v0.2 or later)',
        )
