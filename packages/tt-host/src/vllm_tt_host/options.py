"""The host backend's own ``--additional-config.tt`` keys: ``TTConfig`` accepts them because
``HostMeshBackend.options`` declares them (``vllm_tt_platform.mesh.backend.option_tables``), and
refuses them unless ``mesh_backend`` is ``host``. The configuration reference lists them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from vllm_tt_platform.config.options import TTConfig, option
from vllm_tt_platform.cost.device_time import parse_device_time


@dataclass(frozen=True)
class HostOptions:
    """How the emulated device behaves, as set under ``--additional-config.tt.host_*``."""

    host_device_time: str | None = field(default=None, metadata=option(
        "Host backend only: make the emulated device take modelled time. Programs then run on "
        "the device's own thread and complete no earlier than their duration, and readbacks "
        "complete through events. Unset: programs take as long as the host math. See "
        "docs/async-decode.md for the cost model.", check=parse_device_time,
        allowed="a duration (`25ms`); `served`; `llama-3.1-8b`, `llama-3.3-70b`; `<model>@<MESH_DEVICE preset>`"))
    host_skip_math: bool = field(default=False, metadata=option(
        "Host backend only: skip the model math and return deterministic stand-in tokens "
        "(keyed by input token and position), so emulated large models can be timed on a CPU."))

    @classmethod
    def of(cls, config: TTConfig) -> HostOptions:
        """The host options ``config`` carries (parsed by ``TTConfig.from_sources``)."""
        return cls(**{f.name: config.backend_options[f.name] for f in fields(cls) if f.name in config.backend_options})
