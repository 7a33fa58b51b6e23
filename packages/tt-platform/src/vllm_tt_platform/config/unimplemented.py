"""vLLM options the TT backend accepts from vLLM's parser but does not implement: set away from
their default, each is refused at startup by name instead of being silently ignored (the user
would believe it is on)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_tt_platform.errors import TTUnsupportedFeatureError

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class Unimplemented:
    flag: str
    value: Callable[[VllmConfig], Any]
    """The option's value in the config; None or the default when the user left it alone."""
    default: Any
    why: str


def _path(*names: str, default: Any = None) -> Callable[[VllmConfig], Any]:
    """``config.a.b...``, or ``default`` where a vLLM release lacks the attribute."""
    def read(config: VllmConfig) -> Any:
        value: Any = config
        for name in names:
            value = getattr(value, name, default)
            if value is default:
                return default
        return value
    return read


UNIMPLEMENTED: tuple[Unimplemented, ...] = (
    Unimplemented("--decode-context-parallel-size", _path("parallel_config", "decode_context_parallel_size",
                                                          default=1), 1,
                  "a TT model spreads over the mesh chosen with MESH_DEVICE"),
    Unimplemented("--prefill-context-parallel-size", _path("parallel_config", "prefill_context_parallel_size",
                                                           default=1), 1,
                  "a TT model spreads over the mesh chosen with MESH_DEVICE"),
    Unimplemented("--enable-expert-parallel", _path("parallel_config", "enable_expert_parallel", default=False),
                  False, "a TT MoE model places its experts on the mesh itself"),
    Unimplemented("--enable-eplb", _path("parallel_config", "enable_eplb", default=False), False,
                  "a TT MoE model places its experts on the mesh itself"),
    Unimplemented("--enable-dbo", _path("parallel_config", "enable_dbo", default=False), False,
                  "dual-batch overlap splits GPU micro-batches; the TT runner overlaps with --async-scheduling"),
    Unimplemented("--cpu-offload-gb", _path("offload_config", "uva", "cpu_offload_gb", default=0), 0,
                  "TT weights live on the mesh in the model's own buffers"),
    Unimplemented("--enable-return-routed-experts",
                  _path("aux_output_config", "enable_return_routed_experts", default=False), False,
                  "TT MoE models do not report their routing"),
    Unimplemented("--watermark-config", _path("watermark_config"), None,
                  "the TT samplers do not apply vLLM's watermark"),
)


def refuse_unimplemented(vllm_config: VllmConfig) -> None:
    """Raise for the first option of :data:`UNIMPLEMENTED` set away from its default."""
    for option in UNIMPLEMENTED:
        value = option.value(vllm_config)
        if value is not None and value != option.default:
            raise TTUnsupportedFeatureError(
                option.flag, value, f"{option.default} (not implemented on TT: {option.why})",
                f"remove {option.flag}",
            )
