"""The qwen3_5 host family."""
