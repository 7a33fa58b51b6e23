"""``TTPlatform``: vLLM's view of a Tenstorrent mesh.

vLLM's own tensors stay on the host (``device_type = "cpu"``); the mesh is owned by the TT
worker through the mesh seam. All TT decisions are taken in :mod:`vllm_tt_platform.config.setup`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser


class TTPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    device_control_env_var: str = "TT_VISIBLE_DEVICES"
    simple_compile_backend: str = "eager"
    supported_quantization: list[str] = []

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "tenstorrent"

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls) -> Any:
        return torch.no_grad()

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.manual_seed(seed)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        """The mesh is opened by the TT worker; there is no torch device to select."""

    @classmethod
    def import_kernels(cls) -> None:
        """No vLLM CUDA/CPU kernels are used: the model programs run on the mesh."""

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        """The TT runner owns its KV cache layout."""

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        """vLLM's hybrid KV cache manager (one block table per attention kind) serves models
        whose class declares ``get_kv_cache_spec``; others give one uniform spec, one group."""
        return True

    def is_sleep_mode_available(self) -> bool:
        """vLLM asks this only for ``--enable-sleep-mode``; saying yes lets the TT startup checks
        refuse it with a typed error naming the fix (vLLM's own refusal names neither)."""
        return True

    @classmethod
    def pre_register_and_update(cls, parser: FlexibleArgumentParser | None = None) -> None:
        # On TT, overlapped decode is opt-in from the CLI. Explicit --async-scheduling and
        # --enable-prefix-caching are recorded, so that asking for one on a model that cannot
        # serve it is an error instead of a silent downgrade.
        if parser is not None:
            from vllm_tt_platform.config.cli_flags import record_explicit_use

            parser.set_defaults(async_scheduling=False)
            record_explicit_use(parser)

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm_tt_platform.compat import grant_engine_cleanup_window, release_openmp_before_fork
        from vllm_tt_platform.config.setup import configure

        release_openmp_before_fork()
        configure(vllm_config)
        grant_engine_cleanup_window(vllm_config)

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        from vllm_tt_platform.config.request_checks import check_images, check_pooling_prompt, check_request

        check_request(params)
        check_images(processed_inputs)
        check_pooling_prompt(processed_inputs)
