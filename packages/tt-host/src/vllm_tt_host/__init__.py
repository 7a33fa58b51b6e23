"""The host mesh backend: a CPU emulation of the Tenstorrent device contract.

Fixed trace shapes, paged KV cache, device-side sampling and lanes are honoured; the model math
is real (torch), so everything above the mesh seam runs its production code path. A separate
distribution: the platform finds it through the ``vllm_tt.mesh_backends`` and
``vllm_tt.model_sources`` entry points and never imports it.
"""
