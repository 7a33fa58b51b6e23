"""vllm_tt_scheduler."""
