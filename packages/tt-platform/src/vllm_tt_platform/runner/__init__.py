"""The model runner: one engine step's life, top-down.

``model_runner`` (the hub vLLM's worker calls) plans a step from the scheduler output
(``step``, over the ``batch`` of live requests), builds the step's typed device call
(``call_builder``, ``calls``), submits it, keeps its typed result (``step_results``; the model's
answer read by ``model_output``, overlapped in ``async_decode``) and turns it into vLLM's
sampled output (the ``sampling`` subpackage, over the sampling distribution). May import
``config``, ``mesh`` and the scheduler, sampling and registry distributions; never ``host``
(the host backend is reached only through the model contract).
"""
