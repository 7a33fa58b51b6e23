"""vllm_tt_testing: test support shared by the tests and benchmarks; in the repository only.

No wheel ships it (it lives outside ``packages/``): pytest puts ``testing/`` on ``sys.path``
(``pythonpath`` in the root ``pyproject.toml``) and the benchmarks add it themselves.

- ``scheduler_sim``: drive any vLLM scheduler without a model (a fake runner that checks each
  step, an engine-core loop, step tables).
- ``faults``: fault injectors for the platform's overlapped-decode hooks.
- ``scheduler_outputs``: hand-built vLLM scheduler outputs, to drive a model runner step by step.
- ``checkpoints``: trained tiny checkpoints shared by the host-model and end-to-end tests.
- ``parity``: prompts, transformers' greedy continuation with its logits, and the parity check.
- ``kv_planning``: vLLM's own KV cache planning for one worker (a runner's ``KVCacheConfig``).
"""
