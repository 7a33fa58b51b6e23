"""The plugin marks Mllama's config encoder-decoder, as vLLM reads it, before any config exists."""

from __future__ import annotations

from transformers import AutoConfig, MllamaConfig
from vllm.transformers_utils.config import is_encoder_decoder
from vllm_tt_models_registry.encoder_decoder import mark_encoder_decoder_configs


def test_mllama_configs_built_by_model_type_say_encoder_decoder():
    marked = mark_encoder_decoder_configs()["mllama"]
    config = AutoConfig.for_model("mllama")
    assert isinstance(config, marked) and isinstance(config, MllamaConfig)
    assert is_encoder_decoder(config) and not is_encoder_decoder(MllamaConfig())
    assert mark_encoder_decoder_configs()["mllama"] is marked  # once per process
