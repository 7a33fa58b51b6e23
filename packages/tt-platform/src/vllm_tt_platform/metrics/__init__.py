"""TT metrics on vLLM's ``/metrics``: the engine records each step, the API server exports.

vLLM 0.33 gives a platform no field in ``SchedulerStats`` and its engine-core processes are
forked after ``prometheus_client`` chose its in-memory values, so the runner sends its step
deltas over a ZMQ PUSH socket (``engine``) to the ``vllm.stat_logger_plugins`` logger in each
API server (``frontend``), which records them into Prometheus series there. With
``--api-server-count > 1`` PUSH hands each delta to exactly one API server and vLLM's
multiprocess Prometheus mode sums the servers at scrape time.
"""
