"""Data-parallel lanes inside one engine process: one phase scheduler per lane, one step for all.

``coordinator`` (``TTLaneCoordinator``, the ``scheduler_cls`` in lane mode) drives the lanes of
``member``, merges their outputs (``merge``) and results (``results``), routes the runner's
drafts to each row's lane (``drafts``) and writes the lane step trace (``trace``). ``shape`` is
the lane contract with the platform: the ``tt`` keys the platform records (``LaneShape``) and
the lane numbering of block ids (``BlockNumbering``).

Imports: vLLM and this package's phase-scheduler modules (``scheduler``, ``phase``, ``policy``,
``carry``, ``compat``, ``trace``, ``envs``); never the other way: the phase scheduler knows nothing
of lanes, and only the package root's lazy ``TTLaneCoordinator`` reaches in. ``shape`` (and this
``__init__``) import nothing at all, so the platform imports ``shape`` at config time.
"""
