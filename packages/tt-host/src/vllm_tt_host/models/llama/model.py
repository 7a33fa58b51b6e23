"""The Llama-style classes: they differ only in how ``DecoderConfig.read`` reads their config,
so each class just names its family."""

from __future__ import annotations

from vllm_tt_host.models.frame.generator import HostCausalLM


class HostLlamaForCausalLM(HostCausalLM):
    """Llama 2/3.x: default or llama3 rope, optional attention/MLP bias."""

    family = "llama"


class HostMistralForCausalLM(HostCausalLM):
    """Mistral without a sliding window (v0.2 and later); a window is refused at load."""

    family = "mistral"


class HostQwen2ForCausalLM(HostCausalLM):
    """Qwen 2 / 2.5: bias on the q, k and v projections."""

    family = "qwen2"


class HostQwen3ForCausalLM(HostCausalLM):
    """Qwen 3 (dense): per-head RMSNorm on q and k before rotation."""

    family = "qwen3"
