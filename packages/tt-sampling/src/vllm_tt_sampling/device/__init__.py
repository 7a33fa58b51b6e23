"""Host reference of on-device sampling (what a TT model's sampling program computes)."""

from vllm_tt_sampling.device.sampler import DeviceSample, sample_tokens

__all__ = ["DeviceSample", "sample_tokens"]
