"""Tombstones: tests that fail, naming a compat shim, once the support window no longer needs it.

A shim probes vLLM's API; its tombstone records which releases need it. On the installed vLLM
the probe must agree with that record (so a new release that changes the API is noticed), and
once the lowest supported vLLM (the ``vllm>=`` floor a distribution declares) is past the last
release that needs the shim, the tombstone fails in every session. docs/support-policy.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version


def _minor(version: str) -> Version:
    return Version(".".join(Version(version).base_version.split(".")[:2]))


def installed_vllm() -> Version:
    """The installed vLLM as ``major.minor``."""
    return _minor(metadata.version("vllm"))


def support_floor(dist: str) -> Version:
    """The lowest vLLM ``dist`` declares support for (its ``vllm>=X`` requirement)."""
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        if req.name == "vllm":
            floors = [_minor(s.version) for s in req.specifier if s.operator == ">="]
            if floors:
                return max(floors)
    raise AssertionError(f"{dist} declares no vllm>=X requirement; the support window needs a floor")


@dataclass(frozen=True)
class Tombstone:
    shim: str
    """Dotted name of the shim to delete."""
    dist: str
    """The distribution that owns the shim; its declared vLLM floor is the window's bottom."""
    needed_through: str | None = None
    """Last vLLM release (``major.minor``) that lacks the new API; ``None`` = still needed upstream."""
    needed_from: str | None = None
    """First release that needs it, for workarounds of behaviour vLLM introduced."""

    def needed_on(self, version: Version) -> bool:
        if self.needed_from is not None and version < Version(self.needed_from):
            return False
        return self.needed_through is None or version <= Version(self.needed_through)

    def check(self, needed_here: bool) -> None:
        """``needed_here``: what probing the installed vLLM says (the workaround path is in use)."""
        floor = support_floor(self.dist)
        if self.needed_through is not None and floor > Version(self.needed_through):
            raise AssertionError(
                f"delete {self.shim}: it is needed only through vLLM {self.needed_through}, and "
                f"{self.dist} now supports vLLM >= {floor}. Remove the shim, its callers' use of it "
                "and this tombstone."
            )
        installed = installed_vllm()
        expected = self.needed_on(installed)
        if needed_here != expected:
            raise AssertionError(
                f"{self.shim}: probing vLLM {installed} says the workaround is "
                f"{'needed' if needed_here else 'not needed'}, but its tombstone says "
                f"{'needed' if expected else 'not needed'} (needed_from={self.needed_from}, "
                f"needed_through={self.needed_through}). vLLM changed this API: update the tombstone, "
                "or delete the shim if no supported release needs it."
            )
