"""``HostFamily``: what one family subpackage declares, and the registry table built from them.

A family's ``__init__`` holds its declaration (no torch: the model registry reads the table
through an entry point and imports a class only when it serves it); ``HOST_MODELS`` is
``host_models(FAMILIES)``, never written by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class HostFamily:
    """One family: the TT architectures it serves and where their tiny checkpoints come from."""

    package: str
    """The family's subpackage (its ``__name__``)."""
    models: Mapping[str, str]
    """TT architecture name -> ``"module:Class"`` inside ``package``."""
    tiny: tuple[str, ...]
    """The tiny checkpoints the parity tests build: ``vllm-tt-tiny-model --arch`` values
    (``vllm_tt_host.tiny``), or the ``vllm_tt_testing`` module of a vision-language recipe."""

    def targets(self) -> dict[str, str]:
        """TT architecture name -> ``"package.module:Class"``."""
        return {arch: f"{self.package}.{target}" for arch, target in self.models.items()}


def host_models(families: Iterable[HostFamily]) -> dict[str, str]:
    """The registry table of ``families``, in order; an architecture two families claim is an error."""
    table: dict[str, str] = {}
    for family in families:
        for arch, target in family.targets().items():
            if arch in table:
                raise ValueError(f"{arch} is declared by {table[arch]} and {target}; one family serves it")
            table[arch] = target
    return table
