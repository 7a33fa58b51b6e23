"""The gpt_oss host family."""
