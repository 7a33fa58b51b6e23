"""The runner's side of sampling: how a step uses the sampling distribution.

``step_sampling`` (the one object the runner calls: the per-batch decision, the host sampler's
slots, the output vLLM reads), ``inputs`` (what a device-sampling model is sent), ``output``
(sampled tokens, logprobs and prompt logprobs in vLLM's shapes) and ``trace`` (one line per
decision, when ``TT_SAMPLING_TRACE`` asks for it).
"""
