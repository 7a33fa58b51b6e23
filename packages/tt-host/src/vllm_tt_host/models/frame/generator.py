"""``HostCausalLM``: the TT model contract (a tt-metal "generator") served by host torch math.

It stands where ``tt_transformers``' generator classes stand, so the runner drives it through
exactly the calls it makes on hardware: build, allocate the paged KV cache, warm up (capture
traces), then prefill and decode with fixed shapes. Every forward is a program on the mesh's
command queue. Without modelled device time the queue runs it at once and outputs are host
tensors; with it, ``decode_forward(read_from_device=False)`` returns a handle while the program
runs, read through ``read_decode_output`` / ``process_decode_output_host`` like tt-metal's.
With device sampling the device keeps each slot's last token and position (``DeviceSlots``),
which is what lets the runner overlap decode steps (``supports_async_decode``).

Warmup captures traces but runs no prefill math (a 4096 bucket is slow on CPU and proves
nothing a first request does not); the decode compile pass runs one all-padding step.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm_tt_platform.cost.device_time import ModelDims
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.faults import DelayPoint

from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.frame import block_output, hidden_drafts, mixed, mtp, paged_kv, verify
from vllm_tt_host.models.frame.checkpoint import resolve_checkpoint_dir
from vllm_tt_host.models.frame.config import DecoderConfig
from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.inputs import (
    PrefillRow,
    check_decode,
    check_kv,
    check_kv_shape,
    layer_tables,
    plan_prefill,
    prompt_history,
)
from vllm_tt_host.models.frame.kv_transfer import KVBlockCopies
from vllm_tt_host.models.frame.lanes import LaneLayout
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.prompt_logits import all_position_logits
from vllm_tt_host.models.frame.readback import DecodeHandle, DecodeReader
from vllm_tt_host.models.frame.sampling_step import device_sample, plain_greedy
from vllm_tt_host.models.frame.shapes import (
    MAX_VERIFY_TOKENS,
    PREFILL_BUCKETS,
    HostModelInputError,
    TraceKey,
    buckets_up_to,
)
from vllm_tt_host.models.frame.slot_state import DeviceSlots
from vllm_tt_host.models.frame.synthetic import SyntheticLM
from vllm_tt_host.models.frame.vllm_surface import VllmInspectionSurface

logger = logging.getLogger(__name__)

OPTIMIZATIONS: tuple[str | None, ...] = (None, "performance", "accuracy")
"""tt-metal precision presets; the host runs float32 for all of them."""


class HostCausalLM(KVBlockCopies, DecodeReader, VllmInspectionSurface):
    """A decoder-only LM on the host mesh backend; a family's subclass names the family and,
    where its config or layers differ, its ``config_type`` and ``decoder_type``."""

    family: ClassVar[str] = "llama"
    config_type: ClassVar[type[DecoderConfig]] = DecoderConfig
    """The family's config class; its ``read`` is the family's config reader."""
    decoder_type: ClassVar[type[HostDecoder]] = HostDecoder
    """The family's decoder class; its ``load`` reads the family's weights."""

    model_capabilities: ClassVar[dict[str, Any]] = {
        "supports_sample_on_device": True,
        "supports_async_decode": True,
        "supports_prefix_caching": True,
        "supports_kv_transfer": True,
        "single_program_lanes": True,
        "max_device_top_k": 32,
        "supports_device_penalties": True,
        "max_device_logprobs": 0,
        "supports_prompt_logprobs": True,
        "supports_verify_decode": True,
        "max_verify_tokens": MAX_VERIFY_TOKENS,
        "prefill_trace_lens": list(PREFILL_BUCKETS),
    }

    def __init__(
        self,
        decoder: HostDecoder,
        lanes: LaneLayout,
        max_seq_len: int,
        *,
        device: HostMeshDevice | None = None,
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
        self.device = device or lanes.devices[0]
        self.queue = self.device.command_queue
        self.slots = DeviceSlots(lanes.max_batch_size)
        cfg = decoder.config
        # One sub-mesh's costs: each lane runs on its own (see LaneLayout.prefill_s/decode_s).
        self.costs = self.device.program_costs(ModelDims(
            cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings,
        ), lanes.count)
        self.synthetic = SyntheticLM(self.config.vocab_size) if self.device.skip_math else None
        self.retained: hidden_drafts.RetainedHidden | None = None
        """The target's hidden states for its MTP module, once ``allocate_mtp_kv_cache`` ran."""
        self.mtp_costs = self.costs.with_layers(1) if self.costs is not None and decoder.mtp is not None else None
        """The MTP module's programs: one decoder block of the target's and its own head."""

    @property
    def max_batch_size(self) -> int:
        return self.lanes.max_batch_size

    @property
    def max_block_tokens(self) -> int:
        """The block a block-output step returns per row (``model_capabilities``; 0: none)."""
        return int(self.model_capabilities.get("max_block_tokens", 0))

    def propose_drafts(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: list[LaneKV], num_drafts: Any,
                       **kwargs: Any) -> torch.Tensor:
        """The model's own drafts (the contract's ``propose_drafts``): its first layers cut
        short, as block output drafts (``block_output.propose_drafts``)."""
        width = int(self.model_capabilities.get("max_model_drafts", 0))
        if not width:
            raise HostModelInputError(f"{type(self).__qualname__} does not declare max_model_drafts: it has no "
                                      "drafter of its own")
        return block_output.propose_drafts(self, tokens, start_pos, page_table, kv_cache, num_drafts,
                                           kwargs.get("page_tables_per_layer"), width)

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
        config = cls.decoder_config(hf_config, n_layers=n_layers)
        folder = resolve_checkpoint_dir(str(getattr(hf_config, "_name_or_path", "") or ""))
        decoder = cls.load_decoder(folder, config)
        lanes = LaneLayout.build(mesh_device, max_batch_size, tt_data_parallel)
        model = cls(decoder, lanes, max_seq_len, device=mesh_device)
        if model.costs is not None or model.synthetic is not None:
            logger.info(
                "host device time: %s; model math %s",
                model.costs.description if model.costs is not None else "not modelled",
                "skipped (synthetic tokens)" if model.synthetic is not None else "run",
            )
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
        return model

    @classmethod
    def decoder_config(cls, hf_config: Any, n_layers: int | None = None) -> DecoderConfig:
        """The host math's view of ``hf_config``: the family's ``config_type.read``."""
        return cls.config_type.read(hf_config, cls.family, n_layers=n_layers)

    @classmethod
    def load_decoder(cls, folder: Path, config: DecoderConfig) -> HostDecoder:
        """The family's ``decoder_type`` with the checkpoint's weights; a config of another
        family (a ``decoder_config`` override returning the wrong type) is refused."""
        if not isinstance(config, cls.config_type):
            raise TypeError(f"{cls.__name__} needs a {cls.config_type.__name__}, got {type(config).__name__}")
        return cls.decoder_type.load(folder, config)

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
        cfg = self.config
        num_blocks, block_size = check_kv_shape(kv_cache_shape, num_layers, cfg)
        return paged_kv.allocate(
            self.lanes.count, num_layers, (num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
        )

    @staticmethod
    def layer_storage(shape: tuple[int, int, int, int]) -> list[torch.Tensor]:
        """One layer's ``[K, V]`` storage (a latent-attention model holds one tensor as both)."""
        return paged_kv.allocate(1, 1, shape)[0][0]

    # ---- multi-token prediction (``frame.mtp``) ----------------------------------------

    @property
    def mtp_layers(self) -> int:
        """MTP modules the loaded checkpoint has (0: none; the host serves one)."""
        return 0 if self.decoder.mtp is None else 1

    def allocate_mtp_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any) -> list[LaneKV]:
        """The MTP module's paged KV (the target's layer shape, one page per target block);
        from now on the target's steps keep their hidden states for it."""
        if self.decoder.mtp is None or self.synthetic is not None:
            raise TTConfigError(
                "--speculative-config method", "mtp",
                "a checkpoint with MTP weights, served with model math",
                "serve a checkpoint whose config sets num_nextn_predict_layers and ships its MTP weights "
                "(and leave tt.host_skip_math off)",
            )
        check_kv_shape(kv_cache_shape, self.config.num_layers, self.config)  # one target layer's shape
        self.retained = hidden_drafts.RetainedHidden()
        self.decoder.keep_hidden = True
        return mtp.allocate_mtp_kv(self, kv_cache_shape)

    def mtp_forward(self, tokens: Any, start_pos: Any, num_valid_tokens: Any, page_table: Any, kv_cache: Any,
                    num_drafts: int, **kwargs: Any) -> torch.Tensor:
        """``num_drafts`` greedy drafts per row from the MTP module (``frame.mtp.mtp_forward``)."""
        return mtp.mtp_forward(self, tokens, start_pos, num_valid_tokens, page_table, kv_cache, num_drafts)

    def _retain_prefill(self, slot: int, start: int) -> None:
        if self.retained is not None and self.decoder.last_hidden is not None:
            self.retained.prefilled(slot, start, self.decoder.last_hidden)

    def retain_decode(self, positions: torch.Tensor) -> None:
        """After a decode (or verify) pass over every slot: keep each live row's hidden state."""
        if self.retained is None or self.decoder.last_hidden is None:
            return
        for slot in (positions >= 0).nonzero().flatten().tolist():
            self.retained.decoded(slot, int(positions[slot]), self.decoder.last_hidden[slot])

    # ---- warmup ------------------------------------------------------------------------

    def warmup_model_prefill(
        self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool = False, **kwargs: Any
    ) -> None:
        """With ``enable_trace``, capture every prefill bucket up to ``max_seq_len`` per lane."""
        if not enable_trace:
            return
        for device in self.lanes.devices:
            for bucket in buckets_up_to(self.max_seq_len):
                device.capture_trace(TraceKey.prefill(bucket), self._capture_s(bucket))

    def _capture_s(self, prefill_bucket: int | None) -> float:
        """Modelled time of one capture: one run of the program (0 when time is not modelled)."""
        if self.costs is None:
            return 0.0
        return self.costs.decode_s(0) if prefill_bucket is None else self.costs.prefill_s(prefill_bucket, 0)

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
                device.capture_trace(TraceKey.decode(self.lanes.rows_per_lane, False), self._capture_s(None))
                if can_sample_on_device:
                    device.capture_trace(TraceKey.decode(self.lanes.rows_per_lane, True), self._capture_s(None))
                if kwargs.get(block_output.BLOCK_KWARG):  # block output: one block step shape
                    device.capture_trace(TraceKey.block(self.lanes.rows_per_lane, self.max_block_tokens),
                                         self._capture_s(None))
                for shape in kwargs.get("mixed_shapes") or ():  # mixed steps: one program per shape
                    device.capture_trace(TraceKey.mixed(*shape), self._capture_s(None))
                if kwargs.get("verify_tokens"):  # speculative decoding: one verify shape per K
                    for sampled in (False, True) if can_sample_on_device else (False,):
                        key = TraceKey.verify(self.lanes.rows_per_lane, kwargs["verify_tokens"], sampled)
                        device.capture_trace(key, self._capture_s(None))
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
        Prefill is synchronous: the call returns once the program has completed.

        ``prompt_tokens`` / ``output_tokens`` kwargs, when sent, are the penalty history;
        otherwise each row's tokens up to its prompt length are. ``return_all_logits=True``
        returns logits ``[B, T, V]`` for every computed position (prompt logprobs).
        ``page_tables_per_layer`` (hybrid KV), when sent, replaces ``page_table`` per layer."""
        tokens = torch.as_tensor(tokens)
        page_table = torch.as_tensor(page_table)
        check_kv(kv_cache, self.lanes)
        tables = layer_tables(
            page_table, kwargs.get("page_tables_per_layer"), self.config.num_layers, tokens.shape[0]
        )
        rows = plan_prefill(
            tokens, tables, kv_cache, prompt_lens, start_pos, empty_slots, self.lanes, self.max_seq_len
        )
        if sampling_params is not None and len(sampling_params) != len(rows):
            raise HostModelInputError(f"sampling_params has {len(sampling_params)} rows, the call has {len(rows)}")
        inserts = self.prefill_inserts(tokens, rows, kwargs)
        if enable_trace:  # every shape is checked before any KV is written
            for row in rows:
                self.lanes.devices[row.lane].replay_trace(TraceKey.prefill(row.bucket))
        slots = list(range(len(rows))) if empty_slots is None else [
            int(s) for s in torch.as_tensor(empty_slots).reshape(-1).tolist()
        ]
        costs = self.costs
        duration = self.lanes.prefill_s(costs, rows) if costs is not None else 0.0
        if kwargs.get("return_all_logits"):
            if sampling_params is not None:
                raise HostModelInputError("return_all_logits asks for logits; do not also send sampling_params")
            program = functools.partial(self._all_logits_program, tokens, tables, kv_cache, rows, slots, inserts)
            return self.queue.submit(program, duration).result()
        program = functools.partial(
            self._prefill_program, tokens, tables, kv_cache, rows, slots, sampling_params,
            kwargs.get("prompt_tokens"), kwargs.get("output_tokens"), inserts,
        )
        return self.queue.submit(program, duration).result()

    def prefill_inserts(
        self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any]
    ) -> list[PrefillInserts | None]:
        """Per row, what the prefill adds to its tokens (a ``PrefillInserts`` or None), from the
        call's extra kwargs; a text model adds nothing. Vision-language models override it."""
        return [None] * len(rows)

    def _all_logits_program(
        self, tokens: torch.Tensor, tables: list[torch.Tensor], kv_cache: list[LaneKV], rows: list[Any],
        slots: list[int], inserts: list[PrefillInserts | None],
    ) -> torch.Tensor:
        """``return_all_logits=True``: every computed position's logits (see ``prompt_logits``)."""
        logits = all_position_logits(self.decoder, self.synthetic, tokens, tables, kv_cache, rows, inserts)
        self.slots.prefilled(slots)
        return logits

    def _prefill_program(
        self, tokens: torch.Tensor, tables: list[torch.Tensor], kv_cache: list[LaneKV], rows: list[Any],
        slots: list[int], sampling_params: Any, history: Any, output_tokens: Any,
        inserts: list[PrefillInserts | None],
    ) -> Any:
        self.queue.faults.delay(DelayPoint.PREFILL)
        if self.synthetic is not None:
            last = torch.tensor([row.end - 1 for row in rows])
            logits = self.synthetic.logits(tokens[torch.arange(len(rows)), last], last)
        else:
            per_row = []
            for i, row in enumerate(rows):
                per_row.append(self.decoder.prefill(
                    tokens[i, row.start : row.end], row.start, row.bucket, [t[i] for t in tables],
                    kv_cache[row.lane], inserts=inserts[i],
                ))
                self._retain_prefill(slots[i], row.start)
            logits = torch.stack(per_row)
        self.slots.prefilled(slots)
        if sampling_params is None:
            return logits[:, None, :]
        ends = [row.end for row in rows]
        if history is None and sampling_params.has_penalties:
            history = prompt_history(tokens, ends)
        return device_sample(logits, sampling_params, torch.tensor(ends) - 1, history, output_tokens)

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
        reset_batch: bool = False,
        **kwargs: Any,
    ) -> Any:
        """One step over the full fixed batch; row ``r`` is slot ``r``, ``start_pos == -1``
        marks padding. Returns logits ``[B, 1, V]`` or sampled tokens ``[B]`` as host tensors,
        or, with modelled device time and ``read_from_device=False``, a ``DecodeHandle``.
        With ``num_valid_tokens`` it is a verify step over ``tokens [B, 1 + K]`` (``verify``;
        with ``sampling_params``, verified on the device: argmax tokens ``[B, 1 + K]``); with
        ``block_tokens`` a block-output step (``block_output``: tokens ``[B, max_block_tokens]``).

        With ``sampling_params`` the device's own token and position are used for continuing
        slots (``DeviceSlots``); ``reset_batch`` says the layout changed. Slots never move, so
        ``slot_remap`` needs no action. ``page_tables_per_layer`` (hybrid KV), when sent,
        replaces ``page_table`` per layer."""
        tokens = torch.as_tensor(tokens)
        if kwargs.get(block_output.BLOCK_KWARG) is not None:  # a block-output step: tokens [B, block]
            return block_output.block_forward(
                self, tokens, start_pos, page_table, kv_cache, kwargs[block_output.BLOCK_KWARG], enable_trace,
                kwargs.get("page_tables_per_layer"), self.max_block_tokens,
            )
        if kwargs.get(verify.VERIFY_KWARG) is not None:  # a verify step: tokens [B, 1 + K]
            return verify.verify_forward(self, tokens, start_pos, page_table, kv_cache, kwargs[verify.VERIFY_KWARG],
                                         enable_trace, kwargs.get("page_tables_per_layer"), sampling_params)
        tokens = tokens[:, 0] if tokens.dim() == 2 else tokens.reshape(-1)
        positions = torch.as_tensor(start_pos).reshape(-1).long()
        page_table = torch.as_tensor(page_table)
        check_kv(kv_cache, self.lanes)
        tables = layer_tables(
            page_table, kwargs.get("page_tables_per_layer"), self.config.num_layers, tokens.shape[0]
        )
        check_decode(tokens, positions, tables, kv_cache, self.lanes, self.max_seq_len)
        if enable_trace:
            key = TraceKey.decode(self.lanes.rows_per_lane, sampling_params is not None)
            for device in self.lanes.devices:
                device.replay_trace(key)
        if sampling_params is not None and len(sampling_params) != tokens.shape[0]:
            raise HostModelInputError(
                f"sampling_params has {len(sampling_params)} rows, the call has {tokens.shape[0]}"
            )
        costs = self.costs
        duration = self.lanes.decode_s(costs, positions) if costs is not None else 0.0
        program = functools.partial(
            self._decode_program, tokens, positions, tables, kv_cache, sampling_params,
            prompt_tokens, output_tokens, bool(reset_batch),
        )
        future = self.queue.submit(program, duration)
        if read_from_device or not self.queue.deferred:
            return future.result()
        return DecodeHandle(future, sampling_params is not None, tokens.shape[0], self.config.vocab_size)

    def mixed_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any,
        kv_cache: list[LaneKV],
        chunk_tokens: Any,
        chunk_start: int,
        chunk_page_table: Any,
        chunk_slot: int,
        chunk_completes: bool,
        enable_trace: bool = False,
        **kwargs: Any,
    ) -> Any:
        """A mixed step (``mixed``): the decode rows as ``decode_forward`` takes them (host
        sampled) and one prompt chunk as one ``prefill_forward`` row, in one program; returns
        ``(decode logits [B, 1, V], chunk logits [1, 1, V] or None)``."""
        return mixed.mixed_forward(
            self, tokens, start_pos, page_table, kv_cache, chunk_tokens, chunk_start, chunk_page_table, chunk_slot,
            chunk_completes, enable_trace, kwargs.get("page_tables_per_layer"),
            kwargs.get("chunk_page_tables_per_layer"),
        )

    def _decode_program(
        self, tokens: torch.Tensor, positions: torch.Tensor, tables: list[torch.Tensor], kv_cache: list[LaneKV],
        sampling_params: Any, prompt_tokens: Any, output_tokens: Any, reset: bool,
    ) -> Any:
        self.queue.faults.delay(DelayPoint.DECODE)
        if sampling_params is None:
            self.slots.host_sampled()
        else:
            host_positions = positions
            tokens, positions = self.slots.inputs(tokens, positions, reset=reset)
            if not torch.equal(positions, host_positions):
                check_decode(tokens, positions, tables, kv_cache, self.lanes, self.max_seq_len)
        if self.synthetic is not None and plain_greedy(sampling_params):
            out = self.synthetic.greedy(tokens, positions)
            self.slots.sampled(out, positions)
            return out
        if self.synthetic is not None:
            logits = self.synthetic.logits(tokens, positions)
        else:
            logits = self.decoder.decode(tokens, positions, tables, kv_cache, self.lanes.rows_per_lane)
            self.retain_decode(positions)
        if sampling_params is None:
            return logits[:, None, :]
        out = device_sample(logits, sampling_params, positions.clamp(min=0), prompt_tokens, output_tokens)
        self.slots.sampled(out[0] if isinstance(out, tuple) else out, positions)
        return out
