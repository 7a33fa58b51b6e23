"""Configuration: from vLLM's config and the environment to one ``TTSetup``.

``options`` types every ``--additional-config.tt.<key>``; ``setup`` resolves the model, its
capabilities and the topology (run by the platform hook in every vLLM process);
``startup_checks`` refuses unsupported features before any device work, ``request_checks``
refuses unsupported requests as they arrive; ``cli_flags`` tells what the user typed from
vLLM's defaults. May import ``mesh`` (the topology, the backends' own option tables), the device
cost model (``cost``) and the registry, scheduler and sampling distributions; never ``runner``.
"""
