"""The deepseek_v3 host family."""
