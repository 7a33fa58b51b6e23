"""The gemma3 host family."""
