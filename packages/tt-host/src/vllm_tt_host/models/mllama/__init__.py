"""Llama 3.2 Vision (Mllama): the Llama decoder with gated cross-attention layers over the
projected states of a tiled vision tower, kept in a cross-attention KV cache of their own."""
