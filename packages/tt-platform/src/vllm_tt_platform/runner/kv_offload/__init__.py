"""KV beyond the device: vLLM's native KV offloading (``--kv-offloading-size``) on the mesh.

vLLM's ``OffloadingConnector`` and its CPU manager stay the user surface and decide what is
stored and loaded; the platform gives them a transfer handler (``TTOffloadingSpec`` selects
``TTOffloadingWorker``) that moves blocks through the model contract's ``read_kv_blocks`` /
``write_kv_blocks`` into a host pool (``HostPool``).
"""
