"""vllm_tt_platform."""
