"""The mesh seam: shapes and presets (``shape``), lanes over a mesh (``topology``), and the
backends that open one (``backend`` finds them by name through the ``vllm_tt.mesh_backends``
entry points; ``ttnn_mesh`` is the real ttnn mesh, the host emulation is the vllm-tt-host
distribution's).

Nothing above this seam asks which backend it has. May import ``errors``, ``envs`` and the
device cost model (``cost``); never ``config`` (the options it reads are protocols).
"""
