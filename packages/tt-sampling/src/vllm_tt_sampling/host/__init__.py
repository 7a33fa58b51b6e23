"""Host sampling path of the model runner, built on vLLM's ``Sampler``."""

from vllm_tt_sampling.host.batch import HostSamplingBatch, SeedStream
from vllm_tt_sampling.host.logprobs import prompt_logprobs

__all__ = ["HostSamplingBatch", "SeedStream", "prompt_logprobs"]
