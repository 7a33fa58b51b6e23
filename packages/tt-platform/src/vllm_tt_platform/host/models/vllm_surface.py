"""The members vLLM looks for when it inspects a registered model class.

vLLM decides whether an architecture generates text by inspecting the class (``__init__``
taking ``vllm_config``, ``embed_input_ids``, ``forward``, ``compute_logits``). TT models never
run through these: the TT runner calls ``prefill_forward`` / ``decode_forward``. They exist so
the TT architecture names are accepted, and fail loudly if anything calls them.
"""

from __future__ import annotations

from typing import Any, NoReturn


class VllmInspectionSurface:
    def embed_input_ids(self, input_ids: Any) -> NoReturn:
        _not_served_this_way("embed_input_ids")

    def forward(self, input_ids: Any, positions: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _not_served_this_way("forward")

    def compute_logits(self, hidden_states: Any) -> NoReturn:
        _not_served_this_way("compute_logits")


def _not_served_this_way(member: str) -> NoReturn:
    raise NotImplementedError(
        f"{member}() exists only for vLLM's model inspection; TT models are driven through "
        "prefill_forward/decode_forward by the TT model runner"
    )
