"""How TT models are named: ``TT<HFArch>`` architectures and lazy ``module:Class`` targets."""

from __future__ import annotations

import re

TT_PREFIX = "TT"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ARCH_PATTERN = rf"^{_IDENT}$"
"""An architecture name as Hugging Face configs spell it (``LlamaForCausalLM``)."""
TARGET_PATTERN = rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}$"
"""``package.module:Class``: the lazy form vLLM's ``ModelRegistry.register_model`` accepts."""


def tt_arch_name(hf_arch: str) -> str:
    """The name a TT model is registered under: ``TT`` + the HF architecture, once."""
    return hf_arch if hf_arch.startswith(TT_PREFIX) else TT_PREFIX + hf_arch


def is_target(text: object) -> bool:
    """Whether ``text`` is a well-formed ``module:Class`` string."""
    return isinstance(text, str) and re.match(TARGET_PATTERN, text) is not None


def split_target(target: str) -> tuple[str, str]:
    """``"pkg.mod:Class"`` -> ``("pkg.mod", "Class")``; the caller has checked the form."""
    module, _, qualname = target.partition(":")
    return module, qualname


def target_hint(text: str) -> str:
    """A corrected spelling for the common mistake ``pkg.mod.Class`` (dot instead of colon)."""
    if ":" not in text and "." in text:
        module, _, cls = text.rpartition(".")
        return f"{module}:{cls}"
    return "my_adapter:MyModelForCausalLM"
