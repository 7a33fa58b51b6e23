"""The mesh seam: shapes and presets (``shape``), lanes over a mesh (``topology``), and the
backends that open one (``backend``: the host emulation or, in ``ttnn_mesh``, a real ttnn mesh).

Nothing above this seam asks which backend it has. May import ``errors`` and ``config.options``;
``backend`` imports ``host`` lazily, only when the host backend is chosen.
"""
