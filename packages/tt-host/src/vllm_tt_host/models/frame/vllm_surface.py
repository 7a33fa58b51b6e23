"""The members vLLM looks for when it inspects a registered model class.

vLLM decides whether an architecture generates text by inspecting the class (``__init__``
taking ``vllm_config``, ``embed_input_ids``, ``forward``, ``compute_logits``). TT models never
run through these: the TT runner calls ``prefill_forward`` / ``decode_forward``. They exist so
the TT architecture names are accepted, and fail loudly if anything calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

_Cls = TypeVar("_Cls", bound=type)


class VllmInspectionSurface:
    def embed_input_ids(self, input_ids: Any) -> NoReturn:
        _not_served_this_way("embed_input_ids")

    def forward(self, input_ids: Any, positions: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _not_served_this_way("forward")

    def compute_logits(self, hidden_states: Any) -> NoReturn:
        _not_served_this_way("compute_logits")


def vllm_multimodal_processing(vllm_model_cls: type) -> Callable[[_Cls], _Cls]:
    """Class decorator: the TT class takes over vLLM's own multimodal processing of the model
    ``vllm_model_cls`` (vLLM looks it up on the class serving the architecture): its processor,
    prompt-placeholder text and the multimodal flag. vLLM's processor then turns images into
    the tensors the runner passes to ``prefill_forward`` (``IMAGE_KWARGS``)."""

    def adopt(cls: _Cls) -> _Cls:
        cls._processor_factory = vllm_model_cls._processor_factory  # type: ignore[attr-defined]
        cls.get_placeholder_str = vllm_model_cls.get_placeholder_str  # type: ignore[attr-defined]
        cls.supports_multimodal = True  # type: ignore[attr-defined]
        return cls

    return adopt


def _not_served_this_way(member: str) -> NoReturn:
    raise NotImplementedError(
        f"{member}() exists only for vLLM's model inspection; TT models are driven through "
        "prefill_forward/decode_forward by the TT model runner"
    )
