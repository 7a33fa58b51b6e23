"""The gemma4 host family."""
