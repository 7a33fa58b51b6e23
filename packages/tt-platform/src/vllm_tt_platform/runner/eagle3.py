"""``method: eagle3``: an EAGLE-3 head (a separate one-layer checkpoint) drafts K tokens per row,
run by the model on the mesh (``allocate_eagle3_kv_cache``, ``eagle3_forward``).

The call is the MTP module's: the model keeps the target's auxiliary hidden states on the
device, the runner sends per row only the tokens the target confirmed since the row's last
drafts and gets K draft ids back; the head's KV has one page per target block (vLLM reserves K
lookahead slots per row for ``eagle3``) in the same budget. So the per-row bookkeeping is
``MtpDrafts``', driven through an MTP-shaped view of the model's head calls.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec

from vllm_tt_platform.config.eagle3 import Eagle3HeadConfig
from vllm_tt_platform.runner.mtp import MtpDrafts


class _HeadCalls:
    """The model's EAGLE-3 calls under the names ``MtpDrafts`` drives (one head layer)."""

    mtp_layers = 1

    def __init__(self, model: Any, head: Eagle3HeadConfig) -> None:
        self._model = model
        self._head = head

    def allocate_mtp_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any) -> Any:
        return self._model.allocate_eagle3_kv_cache(self._head.folder, self._head.aux_layer_ids, kv_cache_shape, dtype)

    def mtp_forward(self, **kwargs: Any) -> Any:
        return self._model.eagle3_forward(**kwargs)


class Eagle3Drafts(MtpDrafts):
    """The model's EAGLE-3 head as the runner's ``Drafter``."""

    def __init__(self, vllm_config: VllmConfig, model: Any, num_tokens: int, num_slots: int) -> None:
        spec = vllm_config.speculative_config
        if spec is None or spec.draft_model_config is None:
            raise RuntimeError("Eagle3Drafts without --speculative-config's head (vLLM's draft model config)")
        head = Eagle3HeadConfig.of(spec.draft_model_config, vllm_config.model_config.get_total_num_hidden_layers())
        dtype = vllm_config.model_config.dtype
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"Eagle3Drafts: the model config's dtype {dtype!r} is not resolved to a torch dtype")
        layer_spec = FullAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=head.num_kv_heads,
                                       head_size=head.head_dim, dtype=dtype)
        super().__init__(vllm_config, _HeadCalls(model, head), layer_spec, num_tokens, num_slots)
        self.head = head

    def describe(self, num_blocks: int | None = None) -> str:
        kv = f"{self.bytes_per_block / 1024:.1f} KiB/block"
        if num_blocks is not None:
            kv += f" = {self.bytes_per_block * num_blocks / 2**20:.1f} MiB/lane"
        ids = ", ".join(map(str, self.head.aux_layer_ids))
        return (f"EAGLE-3 head {self.head.folder} (1 layer, draft vocabulary {self.head.draft_vocab_size}) on the mesh "
                f"beside the model, reading target layers [{ids}] kept on device, KV {kv}")
