"""Disaggregated prefill/decode: vLLM's shared-storage ``ExampleConnector`` on the mesh.

vLLM's scheduler side decides what a prefill engine stores and what a decode engine loads
(keyed by the prompt's tokens, as vLLM's disaggregated-serving examples use it); the platform
substitutes the worker side (``connector.ExampleConnector``), which moves whole KV blocks
through the model contract's ``read_kv_blocks`` / ``write_kv_blocks`` (``DevicePages``, the
layer KV offloading uses) to and from one file per layer (``block_files.BlockFiles``).
"""
