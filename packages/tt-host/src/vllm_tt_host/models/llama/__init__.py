"""The llama host family."""
