"""The errors a user can get from the TT platform before any device work."""

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


class TTDeviceNotFoundError(RuntimeError):
    """``mesh_backend=ttnn`` was chosen but no Tenstorrent device can be opened."""
