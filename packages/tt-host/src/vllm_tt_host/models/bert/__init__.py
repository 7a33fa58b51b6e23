"""BERT-style encoders on the host mesh: a pooling model family (bge-large / bge-m3 shape).

Self-contained: its config reading, weights and math live here; it shares with the decoder
families only the checkpoint-folder lookup and the trace emulation of the host device.
"""
