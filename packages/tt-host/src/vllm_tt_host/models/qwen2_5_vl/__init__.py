"""The qwen2_5_vl host family."""
