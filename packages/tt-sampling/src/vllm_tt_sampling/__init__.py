"""vllm_tt_sampling."""
