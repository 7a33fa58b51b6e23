"""The stable import path of the four Llama-style host classes: bundles name
``vllm_tt_host.models.families:HostLlamaForCausalLM`` as their ``main_class``. The classes
live in the ``llama`` family package."""

from __future__ import annotations

from vllm_tt_host.models.llama.model import (
    HostLlamaForCausalLM,
    HostMistralForCausalLM,
    HostQwen2ForCausalLM,
    HostQwen3ForCausalLM,
)

__all__ = ["HostLlamaForCausalLM", "HostMistralForCausalLM", "HostQwen2ForCausalLM", "HostQwen3ForCausalLM"]
