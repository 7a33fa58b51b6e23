"""vllm_tt_models_registry."""
