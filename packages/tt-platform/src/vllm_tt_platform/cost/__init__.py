"""The device cost model: how long a program takes on a Tenstorrent mesh (roofline presets per
chip and mesh, model profiles). Production code: the phase scheduler's ``tt.step_cost`` reads it
(``config.step_cost``), and the host backend replays it as modelled device time.

Imports only ``mesh.shape`` (the mesh vocabulary) and the shared leaves; ``config`` and ``mesh``
may import it, never the reverse.
"""
