"""vllm_tt_sampling: device sampling wire format, the per-batch device/host decision, the host
reference of device sampling (``device``) and the runner's host sampling path (``host``).

The root and ``decision`` import neither torch nor vLLM; ``device`` needs torch, ``host`` vLLM.
"""

from vllm_tt_sampling.decision import (
    DeviceSamplingCaps,
    DeviceSamplingMode,
    RowSampling,
    SamplingDecision,
    SamplingPath,
    SamplingStats,
    choose_sampling_path,
    to_device_params,
)
from vllm_tt_sampling.params import TTSamplingParams

__all__ = [
    "DeviceSamplingCaps",
    "DeviceSamplingMode",
    "RowSampling",
    "SamplingDecision",
    "SamplingPath",
    "SamplingStats",
    "TTSamplingParams",
    "choose_sampling_path",
    "to_device_params",
]
