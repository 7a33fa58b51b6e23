"""The errors a user can get from the TT platform: before any device work, and when the device
fails while serving."""

from __future__ import annotations

from typing import Any


class TTConfigError(Exception):
    """A setting has a value the TT backend cannot serve with.

    The message always names the setting, the bad value, what is allowed and the fix. Not a
    ``ValueError`` on purpose: vLLM builds its config inside pydantic, which would re-wrap a
    ``ValueError`` into a generic validation error and hide this type from the user.
    """

    def __init__(self, setting: str, value: Any, allowed: str, fix: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(f"{setting}={value!r} is not supported: expected {allowed}. Fix: {fix}.")


class TTUnsupportedFeatureError(TTConfigError):
    """The user asked for a vLLM feature the TT backend (or this model) does not provide."""


class TTMeshBackendNotInstalledError(TTConfigError):
    """The chosen mesh backend is registered by no installed distribution (``host`` needs
    ``vllm-tt-host``, which a production install leaves out)."""

    def __init__(self, name: str, distribution: str | None, installed: list[str]) -> None:
        self.distribution = distribution
        allowed = f"an installed backend ({', '.join(installed) or 'none installed'})"
        if distribution:
            fix = (f"install the {distribution} distribution (`pip install {distribution}`, or "
                   f"`pip install ./packages/{distribution.removeprefix('vllm-')}` from the repository), "
                   "or choose another backend")
        else:
            fix = "install the distribution that registers it in vllm_tt.mesh_backends, or choose another backend"
        super().__init__("TT_MESH_BACKEND / --additional-config.tt.mesh_backend", name, allowed, fix)


class TTDeviceNotFoundError(RuntimeError):
    """``mesh_backend=ttnn`` was chosen but no Tenstorrent device can be opened."""


class TTDeviceError(RuntimeError):
    """A device program or readback failed while serving (raised, or returned output the
    contract does not allow). The device state (KV cache, tokens it feeds back) is unknown
    afterwards, so the engine stops rather than serve from it; vLLM then answers every request
    in flight with an error and the API server exits (docs/troubleshooting.md#device-faults)."""

    def __init__(self, call: str, cause: str, fix: str = "check the device (tt-smi), then restart the server") -> None:
        self.call = call
        super().__init__(f"TT device {call} failed: {cause}. The device state is unknown, so the engine "
                         f"stops; the requests in flight are answered with an error. Fix: {fix}.")


class TTReadbackTimeoutError(TTDeviceError):
    """A readback did not complete within ``readback_timeout_s``: the device is taken as hung."""

    def __init__(self, call: str, timeout_s: float) -> None:
        super().__init__(
            call, f"it did not complete within --additional-config.tt.readback_timeout_s={timeout_s:g} s",
            "check the device (tt-smi); raise --additional-config.tt.readback_timeout_s only if a decode "
            "step can legitimately take that long",
        )
