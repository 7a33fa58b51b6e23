"""Host sampling path of the model runner, built on vLLM's ``Sampler``."""

from vllm_tt_sampling.host.batch import HostSamplingBatch, SeedStream

__all__ = ["HostSamplingBatch", "SeedStream"]
