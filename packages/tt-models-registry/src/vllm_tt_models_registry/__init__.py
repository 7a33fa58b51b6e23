"""vllm_tt_models_registry: the TT model contract, the ``TT<Arch>`` registry and bundles."""

from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.errors import BundleError, ContractError, RegistryError
from vllm_tt_models_registry.names import tt_arch_name
from vllm_tt_models_registry.registry import RegisteredModel, TTModelRegistry, load_registry

__all__ = [
    "BundleError",
    "ContractError",
    "ModelCapabilities",
    "RegisteredModel",
    "RegistryError",
    "TTModelRegistry",
    "load_registry",
    "tt_arch_name",
]
