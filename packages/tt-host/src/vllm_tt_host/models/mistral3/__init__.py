"""The mistral3 host family."""
