"""The ``vllm.general_plugins`` entry point: registers the TT architectures with vLLM.

vLLM calls it in every process (front end, engine core, workers, the model-inspection
subprocess), so it is cheap (no target is imported; only bundles are, to check them) and
idempotent. Without bundles it cannot fail on a default environment; a broken bundle or a bad
variable value fails startup with the registry's error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from vllm_tt_models_registry.encoder_decoder import mark_encoder_decoder_configs
from vllm_tt_models_registry.envs import ENV_VARS, TT_MESH_BACKEND
from vllm_tt_models_registry.registry import TTModelRegistry, load_registry

logger = logging.getLogger("vllm." + __name__)  # under vllm's logger so the lines show

_registered_for: tuple[tuple[str, str], ...] | None = None
"""The environment the last successful registration in this process was built from."""


def register(environ: Mapping[str, str] | None = None) -> TTModelRegistry | None:
    """Build the registry for ``TT_MESH_BACKEND`` and register it with vLLM.

    Returns the registry, or None when this process already registered the same environment.
    The encoder-decoder configs (``encoder_decoder``) are marked first, before vLLM reads a config.
    """
    global _registered_for
    mark_encoder_decoder_configs()
    env = os.environ if environ is None else environ
    key = tuple((var.name, env.get(var.name, "")) for var in ENV_VARS)
    if key == _registered_for:
        return None
    registry = load_registry(TT_MESH_BACKEND.read(env), environ=env)
    registry.register_with_vllm()
    _registered_for = key
    for line in registry.startup_summary():
        logger.info("%s", line)
    if not registry.models:
        logger.warning(
            "no TT model is registered: set EXTRA_MODELS_DIR to a folder of bundles or unset "
            "TT_VLLM_BUILTIN_MODELS"
        )
    return registry
