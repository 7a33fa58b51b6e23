"""Pooling programs on the frame's decoders: Qwen3-Embedding-style embeddings and
Qwen3-Reranker-style scores from a causal LM checkpoint.

``DecoderPooling`` gives a ``HostCausalLM`` the pooling contract (``pool_forward``,
``warmup_model_pool``): whole prompts at a fixed ``batch x length`` shape, causal attention,
the final norm's hidden states ``[B, L, H]`` out. Each row runs through the decoder's own
prefill layers over a scratch KV cache that lives for the call only (the program keeps no KV,
as a pooling program on the device does not). In lanes a call's ``B`` rows are ``lanes`` equal
runs, lane ``i``'s on its own sub-mesh, side by side. ``HostDecoderClassifier`` puts a score head on
that: vLLM's online ``ForCausalLM -> ForSequenceClassification`` conversion, whose head is
rows of the LM head picked by ``classifier_from_token`` (``method``: ``from_2_way_softmax``
keeps ``yes - no``, ``no_post_processing`` every named row), read at the last real token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.checkpoint import resolve_checkpoint_dir
from vllm_tt_host.models.frame.lanes import LaneLayout
from vllm_tt_host.models.frame.shapes import HostModelInputError, TraceKey
from vllm_tt_host.models.frame.vllm_surface import VllmInspectionSurface

SCRATCH_BLOCK = 32
"""Block size of a pooling call's scratch KV (one device tile)."""

SCORE_METHODS = ("from_2_way_softmax", "no_post_processing")
"""vLLM's ``method`` values for turning LM-head rows into a classifier (``SEQ_CLS_LOAD_METHODS``)."""


class DecoderPooling:
    """Mixed into a ``HostCausalLM``: its prefill layers as a prefill-only pooling program."""

    decoder: Any
    config: Any
    lanes: LaneLayout
    max_seq_len: int
    costs: Any
    queue: Any

    def warmup_model_pool(self, shapes: Sequence[tuple[int, int]], enable_trace: bool) -> None:
        """Capture one trace per ``(batch, length)`` on every lane (no math: like prefill warmup,
        a first request proves more than an all-padding run)."""
        if not enable_trace:
            return
        for batch, length in shapes:
            duration = self.costs.pool_s(batch, length) if self.costs is not None else 0.0
            for device in self.lanes.devices:
                device.capture_trace(TraceKey.pool(batch, length), duration)

    def pool_forward(self, tokens: Any, prompt_lens: Any, enable_trace: bool = False, **kwargs: Any) -> torch.Tensor:
        """The final-norm hidden states ``[B, L, H]`` of rows ``tokens[i, :prompt_lens[i]]``
        (padding rows, of length 0, come back as zeros)."""
        if kwargs.get("token_type_ids") is not None:
            raise HostModelInputError("a decoder has no token types: send one text per row, not a text pair")
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        lens = torch.as_tensor(prompt_lens, dtype=torch.int64)
        batch, length = tokens.shape
        if length > self.max_seq_len:
            raise HostModelInputError(f"pool_forward of length {length} is longer than max_seq_len {self.max_seq_len}")
        if batch % self.lanes.count:
            raise HostModelInputError(f"pool_forward of {batch} rows does not split into {self.lanes.count} lanes")
        per_lane = batch // self.lanes.count
        if enable_trace:
            for device in self.lanes.devices:
                device.replay_trace(TraceKey.pool(per_lane, length))
        duration = self.costs.pool_s(per_lane, length) if self.costs is not None else 0.0
        return self.queue.submit(lambda: self._pool_program(tokens, lens), duration).result()

    @torch.no_grad()
    def _pool_program(self, tokens: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        batch, length = tokens.shape
        blocks = math.ceil(length / SCRATCH_BLOCK)
        out = torch.zeros(batch, length, cfg.hidden_size)
        pages = [torch.arange(blocks)] * cfg.num_layers
        for row in range(batch):
            n = int(lens[row])
            if n == 0:
                continue
            scratch = paged_kv.allocate(1, cfg.num_layers, (blocks, cfg.num_kv_heads, SCRATCH_BLOCK, cfg.head_dim))[0]
            hidden = self.decoder._prefill_layers(tokens[row, :n], 0, length, pages, scratch, None)
            out[row, :n] = self.decoder._norm(hidden[:n], self.decoder.weights.norm)
        return out


class HostDecoderClassifier(VllmInspectionSurface):
    """A causal LM served as a sequence classifier (a Qwen3-Reranker with vLLM's
    ``--hf-overrides`` recipe): ``pool_forward`` returns the score head's logits ``[B, labels]``
    at each row's last token. A family names its ``causal_lm`` class."""

    causal_lm: ClassVar[type[Any]]
    model_capabilities: ClassVar[dict[str, Any]] = {"pooling_model": True, "pooled_outputs": True}
    # What vLLM's class inspection reads for a pooling architecture.
    is_pooling_model: ClassVar[bool] = True
    default_seq_pooling_type: ClassVar[str] = "LAST"

    def __init__(self, lm: Any, score: torch.Tensor, vllm_config: Any = None) -> None:
        """Built by ``initialize_vllm_model``; ``vllm_config`` is named only for vLLM's class inspection."""
        if vllm_config is not None:
            raise TypeError(f"{type(self).__name__} is built by initialize_vllm_model(), not by vLLM's loader")
        self.lm = lm
        self.score = score

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: HostMeshDevice, max_batch_size: int,
                              max_seq_len: int, tt_data_parallel: int = 1, optimizations: str | None = None,
                              **kwargs: Any) -> HostDecoderClassifier:
        lm = cls.causal_lm.initialize_vllm_model(hf_config, mesh_device, max_batch_size, max_seq_len,
                                                 tt_data_parallel, optimizations, **kwargs)
        folder = resolve_checkpoint_dir(str(getattr(hf_config, "_name_or_path", "") or ""))
        return cls(lm, score_from_lm_head(hf_config, folder, lm.decoder.weights.lm_head))

    def warmup_model_pool(self, shapes: Sequence[tuple[int, int]], enable_trace: bool) -> None:
        self.lm.warmup_model_pool(shapes, enable_trace)

    def pool_forward(self, tokens: Any, prompt_lens: Any, enable_trace: bool = False, **kwargs: Any) -> torch.Tensor:
        lens = torch.as_tensor(prompt_lens, dtype=torch.int64)
        hidden = self.lm.pool_forward(tokens, lens, enable_trace, **kwargs)
        last = hidden[torch.arange(hidden.shape[0]), (lens - 1).clamp(min=0)]
        return torch.nn.functional.linear(last, self.score)


def score_from_lm_head(hf_config: Any, folder: Path, lm_head: torch.Tensor) -> torch.Tensor:
    """The classifier ``[labels, H]`` vLLM derives from the LM head for ``hf_config``'s
    ``method`` and ``classifier_from_token`` (token strings looked up in the checkpoint's
    tokenizer, as vLLM's loader does)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    method = getattr(hf_config, "method", None) or getattr(text, "method", None)
    tokens = getattr(hf_config, "classifier_from_token", None) or getattr(text, "classifier_from_token", None)
    recipe = ("pass --hf-overrides '{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
              "\"classifier_from_token\": [\"no\", \"yes\"], \"is_original_qwen3_reranker\": true}' "
              "(vLLM's Qwen3-Reranker recipe; docs/pooling.md)")
    if method not in SCORE_METHODS or not tokens:
        raise TTConfigError("config.json method / classifier_from_token", (method, tokens),
                            f"one of {', '.join(SCORE_METHODS)} with the classifier's token strings", recipe)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise TTConfigError("classifier_from_token", tokens, f"tokens of the tokenizer in {folder}",
                            "name tokens of the checkpoint's vocabulary (as its tokenizer spells them) "
                            "in --hf-overrides classifier_from_token")
    if method == "from_2_way_softmax":
        if len(ids) != 2:
            raise TTConfigError("classifier_from_token", tokens, "two tokens (false, true) for from_2_way_softmax",
                                recipe)
        return (lm_head[ids[1]] - lm_head[ids[0]])[None].to(torch.float32)
    return lm_head[ids].to(torch.float32)
