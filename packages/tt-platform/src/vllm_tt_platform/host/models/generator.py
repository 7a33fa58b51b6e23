"""``HostCausalLM``: the TT model contract (a tt-metal "generator") served by host torch math.

It stands where ``tt_transformers``' generator classes stand, so the runner drives it through
exactly the calls it makes on hardware: build, allocate the paged KV cache, warm up (capture
traces), then prefill and decode with fixed shapes. Inputs are host tensors and outputs are
returned as host tensors, so the runner never needs ``read_decode_output``.

Warmup captures traces but runs no prefill math (a 4096 bucket is slow on CPU and proves
nothing a first request does not); the decode compile pass runs one all-padding step.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch

from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.host.device import HostMeshDevice
from vllm_tt_platform.host.models import paged_kv
from vllm_tt_platform.host.models.checkpoint import load_decoder_weights, resolve_checkpoint_dir
from vllm_tt_platform.host.models.config import DecoderConfig
from vllm_tt_platform.host.models.decoder import HostDecoder
from vllm_tt_platform.host.models.inputs import check_decode, check_kv, plan_prefill, prompt_history
from vllm_tt_platform.host.models.lanes import LaneLayout
from vllm_tt_platform.host.models.paged_kv import LaneKV
from vllm_tt_platform.host.models.prompt_logits import all_position_logits
from vllm_tt_platform.host.models.shapes import (
    PREFILL_BUCKETS,
    HostModelInputError,
    TraceKey,
    buckets_up_to,
)
from vllm_tt_platform.host.models.vllm_surface import VllmInspectionSurface

logger = logging.getLogger(__name__)

OPTIMIZATIONS: tuple[str | None, ...] = (None, "performance", "accuracy")
"""tt-metal precision presets; the host runs float32 for all of them."""


class HostCausalLM(VllmInspectionSurface):
    """A decoder-only LM on the host mesh backend; subclasses name the family."""

    family: ClassVar[str] = "llama"

    model_capabilities: ClassVar[dict[str, Any]] = {
        "supports_sample_on_device": True,
        "supports_async_decode": False,
        "supports_prefix_caching": True,
        "single_program_lanes": True,
        "max_device_top_k": 32,
        "supports_device_penalties": True,
        "max_device_logprobs": 0,
        "supports_prompt_logprobs": True,
        "prefill_trace_lens": list(PREFILL_BUCKETS),
    }

    def __init__(
        self,
        decoder: HostDecoder,
        lanes: LaneLayout,
        max_seq_len: int,
        *,
        vllm_config: Any = None,
        prefix: str = "",
    ) -> None:
        """Built by ``initialize_vllm_model``; ``vllm_config`` is named only so that vLLM's
        class inspection accepts the class, and passing it is an error."""
        if vllm_config is not None:
            raise TypeError(
                f"{type(self).__name__} is built by initialize_vllm_model(), not by vLLM's loader"
            )
        self.decoder = decoder
        self.config = decoder.config
        self.lanes = lanes
        self.max_seq_len = max_seq_len

    @property
    def max_batch_size(self) -> int:
        return self.lanes.max_batch_size

    # ---- class-level contract ----------------------------------------------------------

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: HostMeshDevice,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
        n_layers: int | None = None,
        **kwargs: Any,
    ) -> HostCausalLM:
        """Load the checkpoint of ``hf_config`` and split ``mesh_device`` into lanes.

        ``n_layers`` keeps only the first layers (tt-metal's test hook)."""
        if optimizations not in OPTIMIZATIONS:
            raise TTConfigError(
                "optimizations",
                optimizations,
                "null, 'performance' or 'accuracy'",
                "set additional_config tt.optimizations to one of those",
            )
        if max_seq_len < 1:
            raise TTConfigError("max_seq_len", max_seq_len, "a positive int", "set --max-model-len")
        config = DecoderConfig.from_hf(hf_config, cls.family, n_layers=n_layers)
        folder = resolve_checkpoint_dir(str(getattr(hf_config, "_name_or_path", "") or ""))
        decoder = HostDecoder(config, load_decoder_weights(folder, config))
        lanes = LaneLayout.build(mesh_device, max_batch_size, tt_data_parallel)
        logger.info(
            "host %s model from %s: %d layers, %d heads (%d kv) x %d, vocab %d; %d lane(s) x %d "
            "rows, max_seq_len %d, float32",
            cls.family,
            folder,
            config.num_layers,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.vocab_size,
            lanes.count,
            lanes.rows_per_lane,
            max_seq_len,
        )
        return cls(decoder, lanes, max_seq_len)

    @classmethod
    def get_max_tokens_all_users(
        cls,
        model_name: str,
        num_devices: int,
        tt_data_parallel: int,
        max_model_len: int,
        max_num_seqs: int,
        **kwargs: Any,
    ) -> int:
        """KV tokens one lane needs: each of its rows at full length. ``max_num_seqs`` is the
        rows of one lane, as the runner passes it (a global count would only over-provision)."""
        if max_model_len < 1 or max_num_seqs < 1:
            raise TTConfigError(
                "max_model_len/max_num_seqs",
                (max_model_len, max_num_seqs),
                "positive ints",
                "set --max-model-len and --max-num-seqs",
            )
        return max_model_len * max_num_seqs

    # ---- KV cache ----------------------------------------------------------------------

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any, num_layers: int) -> list[LaneKV]:
        """``kv[lane][layer] = [K, V]``, always float32 (like tt-metal, the requested dtype is
        the runner's guess; host parity needs float32).

        The shape may carry one device's share of the KV heads; the host keeps them all."""
        if len(kv_cache_shape) != 4:
            raise HostModelInputError(
                f"kv_cache_shape must be (num_blocks, kv_heads, block_size, head_dim), got {kv_cache_shape}"
            )
        num_blocks, heads, block_size, head_dim = (int(v) for v in kv_cache_shape)
        cfg = self.config
        if num_layers != cfg.num_layers:
            raise HostModelInputError(f"num_layers={num_layers}, but the model has {cfg.num_layers} layers")
        if head_dim != cfg.head_dim or heads < 1 or cfg.num_kv_heads % heads:
            raise HostModelInputError(
                f"kv_cache_shape {tuple(kv_cache_shape)} does not fit the model: expected "
                f"head_dim {cfg.head_dim} and a divisor of its {cfg.num_kv_heads} kv heads"
            )
        if num_blocks < 1 or block_size < 1:
            raise HostModelInputError(f"kv_cache_shape {tuple(kv_cache_shape)} has an empty dimension")
        return paged_kv.allocate(
            self.lanes.count, num_layers, (num_blocks, cfg.num_kv_heads, block_size, head_dim)
        )

    # ---- warmup ------------------------------------------------------------------------

    def warmup_model_prefill(
        self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool = False, **kwargs: Any
    ) -> None:
        """With ``enable_trace``, capture every prefill bucket up to ``max_seq_len`` per lane."""
        if not enable_trace:
            return
        for device in self.lanes.devices:
            for bucket in buckets_up_to(self.max_seq_len):
                device.capture_trace(TraceKey.prefill(bucket))

    def warmup_model_decode(
        self,
        kv_cache: Any,
        enable_trace: bool,
        max_batch_size: int,
        num_blocks: int,
        can_sample_on_device: bool = False,
        **kwargs: Any,
    ) -> None:
        """Compile pass: one all-padding decode step (no KV write). Trace pass: capture the
        decode program per lane, with and (if allowed) without device sampling."""
        if max_batch_size != self.max_batch_size:
            raise HostModelInputError(
                f"warmup max_batch_size={max_batch_size}, but the model was built for "
                f"{self.max_batch_size} decode rows"
            )
        if enable_trace:
            for device in self.lanes.devices:
                device.capture_trace(TraceKey.decode(self.lanes.rows_per_lane, False))
                if can_sample_on_device:
                    device.capture_trace(TraceKey.decode(self.lanes.rows_per_lane, True))
            return
        rows = self.max_batch_size
        self.decode_forward(
            tokens=torch.zeros(rows, 1, dtype=torch.int32),
            start_pos=torch.full((rows,), -1, dtype=torch.int32),
            page_table=torch.zeros(rows, max(num_blocks, 1), dtype=torch.int32),
            kv_cache=kv_cache,
        )

    # ---- forward -----------------------------------------------------------------------

    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: list[LaneKV],
        prompt_lens: Any,
        start_pos: Any = None,
        empty_slots: Any = None,
        sampling_params: Any = None,
        enable_trace: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Row ``i`` computes positions ``[start_pos[i], prompt_lens[i])`` of ``tokens[i]``
        into the KV cache of slot ``empty_slots[i]``'s lane; returns logits ``[B, 1, V]`` for
        position ``prompt_lens[i] - 1``, or sampled tokens when ``sampling_params`` is given.

        ``prompt_tokens`` / ``output_tokens`` kwargs, when sent, are the penalty history;
        otherwise each row's tokens up to its prompt length are. ``return_all_logits=True``
        returns logits ``[B, T, V]`` for every computed position (prompt logprobs)."""
        tokens = torch.as_tensor(tokens)
        page_table = torch.as_tensor(page_table)
        check_kv(kv_cache, self.lanes)
        rows = plan_prefill(
            tokens, page_table, kv_cache, prompt_lens, start_pos, empty_slots, self.lanes, self.max_seq_len
        )
        if enable_trace:  # every shape is checked before any KV is written
            for row in rows:
                self.lanes.devices[row.lane].replay_trace(TraceKey.prefill(row.bucket))
        if kwargs.get("return_all_logits"):
            if sampling_params is not None:
                raise HostModelInputError("return_all_logits asks for logits; do not also send sampling_params")
            return all_position_logits(self.decoder, None, tokens, page_table, kv_cache, rows)
        logits = torch.stack(
            [
                self.decoder.prefill(
                    tokens[i, row.start : row.end],
                    row.start,
                    row.bucket,
                    page_table[i],
                    kv_cache[row.lane],
                )
                for i, row in enumerate(rows)
            ]
        )
        if sampling_params is None:
            return logits[:, None, :]
        ends = [row.end for row in rows]
        history = kwargs.get("prompt_tokens")
        if history is None and sampling_params.has_penalties:
            history = prompt_history(tokens, ends)
        last_input = torch.tensor(ends) - 1
        return self._sample(logits, sampling_params, last_input, history, kwargs.get("output_tokens"))

    def decode_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any,
        kv_cache: list[LaneKV],
        enable_trace: bool = False,
        read_from_device: bool = True,
        sampling_params: Any = None,
        prompt_tokens: Any = None,
        output_tokens: Any = None,
        **kwargs: Any,
    ) -> Any:
        """One step over the full fixed batch; row ``r`` is slot ``r``, ``start_pos == -1``
        marks padding. Returns logits ``[B, 1, V]`` or sampled tokens ``[B]``.

        ``read_from_device`` is accepted and ignored: outputs are always host tensors. The
        model keeps no per-slot state, so ``slot_remap`` and ``reset_batch`` need no action."""
        tokens = torch.as_tensor(tokens)
        tokens = tokens[:, 0] if tokens.dim() == 2 else tokens.reshape(-1)
        positions = torch.as_tensor(start_pos).reshape(-1).long()
        page_table = torch.as_tensor(page_table)
        check_kv(kv_cache, self.lanes)
        check_decode(tokens, positions, page_table, kv_cache, self.lanes, self.max_seq_len)
        if enable_trace:
            key = TraceKey.decode(self.lanes.rows_per_lane, sampling_params is not None)
            for device in self.lanes.devices:
                device.replay_trace(key)
        logits = self.decoder.decode(tokens, positions, page_table, kv_cache, self.lanes.rows_per_lane)
        if sampling_params is None:
            return logits[:, None, :]
        return self._sample(logits, sampling_params, positions.clamp(min=0), prompt_tokens, output_tokens)

    # ---- helpers -----------------------------------------------------------------------

    def _sample(
        self,
        logits: torch.Tensor,
        params: Any,
        last_input: torch.Tensor,
        prompt_tokens: Any,
        output_tokens: Any,
    ) -> Any:
        """Device sampling: tokens ``[B]``, or ``(tokens, logprobs)`` when any row asks for
        logprobs (the runner requires the tuple then). Seeded draws are keyed by each row's
        last input position, as the sampler documents."""
        from vllm_tt_sampling.device import sample_tokens

        if len(params) != logits.shape[0]:
            raise HostModelInputError(
                f"sampling_params has {len(params)} rows, the call has {logits.shape[0]}"
            )
        result = sample_tokens(
            logits,
            params,
            last_input.long(),
            None if prompt_tokens is None else torch.as_tensor(prompt_tokens),
            None if output_tokens is None else torch.as_tensor(output_tokens),
        )
        if any(params.enable_log_probs):
            return result.tokens, result.logprobs
        return result.tokens
