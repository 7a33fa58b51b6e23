"""The TT model contract: what a model class must provide to be served by vllm-tt.

It is the interface tt-metal's generator classes (``models/tt_transformers/tt/generator_vllm.py``
and the demos' ``generator_vllm.py``) already implement, so those classes drop in unchanged.
Everything the runner calls is listed here once, with the exact way it is called
(:data:`CALLS`); the registry checks a class against it when the class is registered.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.errors import ContractError

__all__ = [
    "CALLS",
    "IMAGE_KWARGS",
    "CROSS_PAGE_TABLE_KWARG",
    "KV_TRANSFER_HANDLE",
    "KV_TRANSFER_METHODS",
    "VIDEO_KWARGS",
    "AUDIO_KWARGS",
    "MM_POSITIONS_KWARG",
    "ROPE_DELTAS_KWARG",
    "VERIFY_KWARG",
    "BLOCK_KWARG",
    "MIXED_KWARGS",
    "OPTIONAL_METHODS",
    "POOLING_REQUIRED_METHODS",
    "REQUIRED_METHODS",
    "CallShape",
    "ContractError",
    "ModelCapabilities",
    "TTModel",
    "TTModelExtras",
    "check_model_class",
]


@runtime_checkable
class TTModel(Protocol):
    """A TT model ("generator"), as tt-metal's ``generator_vllm.py`` classes implement it.

    Forward and warmup calls pass keyword arguments; implementations should accept
    ``**kwargs`` so that new optional arguments do not break them.
    """

    model_capabilities: ClassVar[Mapping[str, Any]]
    """Optional: see :class:`ModelCapabilities` for the keys; missing keys take defaults."""

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> TTModel:
        """Build the model on ``mesh_device``. ``max_batch_size`` is the global decode batch
        (lanes x per-lane rows); the model splits it by ``tt_data_parallel``."""
        ...

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any, num_layers: int) -> Any:
        """Allocate the paged KV cache: per lane, per layer, ``[K, V]`` each of
        ``(num_blocks, num_kv_heads, block_size, head_dim)``. The result is opaque to the runner.
        A class may provide ``allocate_kv_cache_per_layer`` instead."""
        ...

    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Any,
        start_pos: Any = None,
        empty_slots: Any = None,
        sampling_params: Any = None,
        enable_trace: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Compute positions ``[start_pos, prompt_lens)`` of each row, write their KV through
        ``page_table`` and return the next-token logits ``[B, 1, V]`` (or tokens ``[B]`` /
        ``(tokens, logprobs)`` when ``sampling_params`` is given) for position ``prompt_len-1``.

        A multimodal model also gets its images (:data:`IMAGE_KWARGS`) on every prefill call
        whose rows have any; an mRoPE model (``uses_mrope``) returns ``(out, rope_deltas)``,
        ``rope_deltas[i]`` (an int, or anything ``int()`` takes) row ``i``'s position delta."""
        ...

    def decode_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any,
        kv_cache: Any,
        enable_trace: bool = False,
        read_from_device: bool = True,
        sampling_params: Any = None,
        **kwargs: Any,
    ) -> Any:
        """One decode step over the full fixed batch; rows with ``start_pos == -1`` are padding
        and must neither write KV nor matter. Returns logits ``[B, 1, V]`` or tokens ``[B]``
        (optionally with logprobs), or a device handle when ``read_from_device`` is false.

        An mRoPE model also gets :data:`ROPE_DELTAS_KWARG` on every decode call.

        A verify step of speculative decoding (``supports_verify_decode``) sends
        ``tokens [B, 1 + K]`` and :data:`VERIFY_KWARG` (with ``sampling_params`` when the
        device verifies greedy rows itself); see there. A block-output decode step
        (``max_block_tokens``) sends :data:`BLOCK_KWARG`; see there."""
        ...


class TTModelExtras(Protocol):
    """Optional members: the runner uses each one only if the class has it."""

    @classmethod
    def get_max_tokens_all_users(
        cls,
        model_name: str,
        num_devices: int,
        tt_data_parallel: int,
        max_model_len: int,
        max_num_seqs: int,
    ) -> int:
        """The KV token pool shared by all users of one lane; sizes the KV cache without
        memory profiling (131072 when absent)."""
        ...

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> Any:
        """``{layer name: KVCacheSpec}`` for models with mixed attention (sliding windows);
        opts into one page table per layer group."""
        ...

    def allocate_kv_cache_per_layer(self, per_layer_specs: Any) -> Any:
        """Like ``allocate_kv_cache`` from ``[(shape, dtype, tensor_idx), ...]``; layers with
        the same ``tensor_idx`` share storage."""
        ...

    def allocate_mtp_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any) -> Any:
        """The multi-token-prediction module's paged KV (one target layer's page shape, one
        page per target block); from then on the target's steps keep their final hidden states
        on the device for ``mtp_forward``. Required when ``supports_mtp`` is declared."""
        ...

    def mtp_forward(self, tokens: Any, start_pos: Any, num_valid_tokens: Any, page_table: Any, kv_cache: Any,
                    num_drafts: int, **kwargs: Any) -> Any:
        """``num_drafts`` draft ids per row ``[B, num_drafts]`` from the MTP module, reading the
        hidden states the last target step kept. Required when ``supports_mtp`` is declared."""
        ...

    def allocate_eagle3_kv_cache(self, head_dir: str, aux_layer_ids: tuple[int, ...], kv_cache_shape: tuple[int, ...],
                                 dtype: Any) -> Any:
        """Load the EAGLE-3 head in ``head_dir`` onto the mesh and return its paged KV (the head
        layer's page shape, one page per target block); from then on the target's steps keep the
        auxiliary hidden states of ``aux_layer_ids`` on the device for ``eagle3_forward``.
        Required when ``supports_eagle3`` is declared."""
        ...

    def eagle3_forward(self, tokens: Any, start_pos: Any, num_valid_tokens: Any, page_table: Any, kv_cache: Any,
                       num_drafts: int, **kwargs: Any) -> Any:
        """``num_drafts`` chained draft ids per row ``[B, num_drafts]`` (target ids) from the
        EAGLE-3 head, reading the auxiliary hidden states the target's steps kept; arguments as
        ``mtp_forward``'s. Required when ``supports_eagle3`` is declared."""
        ...

    def propose_drafts(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, num_drafts: Any,
                       **kwargs: Any) -> Any:
        """The model's own drafts: int ``[B, max_model_drafts]``, up to ``num_drafts[r]`` ids after
        row ``r``'s last token ``tokens[r]`` at ``start_pos[r]`` (-1 beyond them, and for padding
        rows: ``start_pos`` -1, ``num_drafts`` 0). Required when ``max_model_drafts`` is declared."""
        ...

    def read_kv_blocks(self, kv_cache: Any, lane: int, layers: Any, block_ids: Any) -> Any:
        """Start copying blocks ``block_ids`` (int, the lane's own ids) of decoder ``layers``
        from lane ``lane``'s KV cache to host memory; returns at once with a handle (see
        :data:`KV_TRANSFER_HANDLE`) whose ``result()`` is, per layer in ``layers`` order, the
        layer's distinct cache tensors (K and V; one latent; a recurrent layer's states) each
        indexed by block: ``[len(block_ids), ...]`` host tensors in the device's layout. The
        copy runs in order with the programs already queued, so it sees their KV. Required
        when ``supports_kv_transfer`` is declared."""
        ...

    def write_kv_blocks(self, kv_cache: Any, lane: int, layers: Any, block_ids: Any, pages: Any) -> Any:
        """Start copying ``pages`` (what ``read_kv_blocks`` returned for the same ``layers``,
        any blocks) into blocks ``block_ids`` of lane ``lane``'s KV cache; returns at once with
        a handle whose ``result()`` is None once the blocks are on the device, before any
        program queued after the call runs. Required when ``supports_kv_transfer`` is declared."""
        ...

    def mixed_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, chunk_tokens: Any,
                      chunk_start: int, chunk_page_table: Any, chunk_slot: int, chunk_completes: bool,
                      enable_trace: bool = False, **kwargs: Any) -> Any:
        """A mixed step (``mixed_shapes``): the decode rows and one prompt chunk in one program,
        one pass over the weights; see :data:`MIXED_KWARGS`. Required when ``mixed_shapes`` is
        declared."""
        ...

    def read_decode_output(self, tt_out: Any, async_read: bool = False) -> Any:
        """Start a non-blocking readback of one decode submission: ``(host_out, events)``.
        Required when ``supports_async_decode`` is declared."""
        ...

    def process_decode_output_host(self, tt_out: Any, is_tokens: bool = False) -> Any:
        """Turn a device handle or a ``read_decode_output`` result into host tensors."""
        ...

    def pool_forward(self, tokens: Any, prompt_lens: Any, enable_trace: bool = False, **kwargs: Any) -> Any:
        """A pooling model's one program (``pooling_model``): a whole-prompt forward pass over
        ``tokens`` int64 ``[B, L]`` (row ``i`` holds ``prompt_lens[i]`` tokens, left-aligned, then
        padding; a padding row has length 0), at one of the fixed shapes warmup ran. Returns the
        last hidden states ``[B, L, H]`` (anything ``torch.as_tensor`` takes); the runner pools
        them per request (vLLM's pooler config: CLS, MEAN or LAST, then normalisation). A model
        declaring ``pooled_outputs`` returns its head's ``[B, D]`` instead (a classifier's
        logits; the runner applies vLLM's classification activation). A pair of texts (a
        cross-encoder's query and document) also gets ``token_type_ids`` int64 ``[B, L]``
        (1 over the second text). With ``tt_data_parallel`` lanes ``B`` is lanes x the shape's
        batch ``b``: lane ``i`` pools rows ``[i*b, (i+1)*b)`` on its sub-mesh, side by side.
        No KV cache is read or written. With ``enable_trace`` the call replays the shape's trace, which
        warmup captured by calling it once per shape with ``enable_trace=True``."""
        ...

    def warmup_model_prefill(self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool) -> None:
        """Compile (and with ``enable_trace``, capture) the prefill programs before serving."""
        ...

    def warmup_model_pool(self, shapes: Any, enable_trace: bool) -> None:
        """A pooling model's warmup: compile the ``pool_forward`` program of every
        ``(batch, length)`` in ``shapes`` (and with ``enable_trace``, capture its trace). The
        runner serves only these shapes."""
        ...

    def warmup_model_decode(
        self,
        kv_cache: Any,
        enable_trace: bool,
        max_batch_size: int,
        num_blocks: int,
        can_sample_on_device: bool,
    ) -> None:
        """Compile (and with ``enable_trace``, capture) the decode programs before serving."""
        ...


IMAGE_KWARGS: tuple[str, ...] = ("pixel_values", "image_grid_thw", "num_patches", "image_sizes")
"""The image keyword arguments of ``prefill_forward`` (multimodal models, prefill steps only):
the keys vLLM's processor for the model produces, passed through by name (these are the
known ones; a processor's other keys are passed the same way).

Each is a list with one entry per row, in the call's row order: ``None`` for a row without
images, else a list with one entry per image of the request, in prompt order (every image, on
every prefill pass of the row: a later chunk or a resume needs them for its positions), each
that image's tensor (``None`` if its processor output lacks the key, or vLLM did not send it:
an image inside the request's prefix-cache hit comes without data, an mRoPE model's keeps only
its CPU-side keys such as ``image_grid_thw``). Qwen2.5-VL:
``pixel_values`` ``[patches, C*T*P*P]`` (uint8 unless ``--mm-device-do-normalize false``) and
``image_grid_thw`` int64 ``[3]``, ``(t, h, w)`` in patches. Gemma 3: ``pixel_values``
``[crops, C, H, W]`` and ``num_patches``. Mistral 3: ``pixel_values`` ``[C, H, W]``.
Qwen3-VL: as Qwen2.5-VL; its DeepStack features (added at the image positions after the first
decoder layers) are not sent: the model computes them with its own tower from these inside
``prefill_forward`` and hands them to those layers itself (the host reference carries them in
the row's ``PrefillInserts.layer_adds``)."""

VIDEO_KWARGS: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
"""The video keyword arguments of ``prefill_forward`` (a model declaring ``video`` in its
``modalities``), laid out as :data:`IMAGE_KWARGS` over the same item lists: a request's images
and videos are one list per row in prompt order, so ``pixel_values`` is ``None`` at a video's
place and ``pixel_values_videos`` at an image's. Qwen2.5-VL: ``pixel_values_videos``
``[patches, C*T*P*P]`` (frames as vLLM's processor sampled them, ``T`` of them per temporal
patch), ``video_grid_thw`` int64 ``[3]`` and ``second_per_grid_ts`` (seconds one temporal
patch spans: the mRoPE temporal index steps by it times ``tokens_per_second``). Qwen3-VL: the
first two; the processor puts each frame's timestamp as text between its placeholder runs."""

AUDIO_KWARGS: tuple[str, ...] = ("input_features_padded", "input_features_mask")
"""The audio keyword arguments of ``prefill_forward`` (a model declaring ``audio``), laid out as
:data:`IMAGE_KWARGS` over the same item lists (``None`` at an image's or a video's place). Gemma
4: ``input_features_padded`` ``[frames, mels]`` log-mel frames of one clip as vLLM's processor
keeps them (its own frames, no batch padding) and ``input_features_mask`` ``[frames]`` (True: a
real frame); the clip's tokens are one audio-token run between its markers."""

MM_POSITIONS_KWARG = "mm_positions"
"""``prefill_forward``'s argument next to :data:`IMAGE_KWARGS` (any prefill call whose rows have
multimodal items): per row ``None`` or one ``(offset, length)`` pair of ints per item, over the
same item lists, saying where the item's placeholder tokens lie in the prompt (vLLM's
``PlaceholderRange``: a video's covers all its frames and the text between them). It is sent
for every item, data or not, so that a model can tell which placeholder runs belong to an item
inside the prefix-cache hit, whose data vLLM does not send (Gemma 4: how many frame runs a
covered video has)."""

CROSS_PAGE_TABLE_KWARG = "cross_page_table"
"""``prefill_forward``'s and ``decode_forward``'s argument for a model declaring the
``cross_attention`` KV kind (an encoder-decoder model: Llama 3.2 Vision): int32 ``[rows, width]``
like ``page_table`` (prefill: call order; decode: slot order), each row's blocks of its encoder
states (vLLM's ``CrossAttentionSpec`` group; empty for a request without images). tt-metal's
Mllama takes it under this name."""

KV_TRANSFER_HANDLE = ("done", "result")
"""What ``read_kv_blocks`` / ``write_kv_blocks`` return: an object with ``done() -> bool``
(the copy completed; never blocks) and ``result()`` (blocks until it did, then gives its
value or raises its error), like a ``concurrent.futures.Future``."""

KV_TRANSFER_METHODS: tuple[str, ...] = ("read_kv_blocks", "write_kv_blocks")
"""The members ``supports_kv_transfer`` requires."""

ROPE_DELTAS_KWARG = "rope_deltas_all_users"
"""``decode_forward``'s mRoPE argument: ``list[int]`` of length ``max_batch_size``, slot order
(row ``r`` is slot ``r``, as ``tokens``), each live slot's delta as its prefill returned it
(the decode position of a token is ``start_pos + delta``), 0 for padding rows."""


VERIFY_KWARG = "num_valid_tokens"
"""``decode_forward``'s verify-step argument (speculative decoding, ``supports_verify_decode``):
int ``[B]``, slot order, how many of row ``r``'s ``1 + K`` tokens are real (its last token, then
its drafts at the following positions; 0 for padding rows). The call returns float logits
``[B, 1 + K, V]``, ``[r, j]`` after token ``j`` at position ``start_pos[r] + j``, and writes the
KV of every real position (those of rejected drafts are overwritten by later steps); the runner
samples them on the host (vLLM's rejection sampler).

Device-side verification (a model with ``supports_sample_on_device``, when the batch samples on
device and every row is greedy): the call also gets ``sampling_params`` (one greedy wire row per
slot, no penalties, no logprobs) and returns int tokens ``[B, 1 + K]`` instead, ``[r, j]`` the
argmax after position ``start_pos[r] + j``; only these ids are read back, and the runner keeps
each row's drafts up to the first that differs (``vllm_tt_sampling.acceptance``). A verify step
leaves no token on the device for the next decode (the host decides which drafts stand), so the
next call's inputs are the host's.

Warmup gets ``verify_tokens=1 + K`` (``warmup_model_decode``) to capture the verify trace, and
with ``can_sample_on_device`` its device-sampling variant."""

BLOCK_KWARG = "block_tokens"
"""``decode_forward``'s block-output argument (``max_block_tokens``; adaptive block output):
int ``[B]``, slot order, the most tokens row ``r`` may commit in this step (1 up to the
operator's block size ``--additional-config.tt.block_tokens``, at most ``max_block_tokens``;
0 for padding rows). The runner sends it on a decode step whose rows are
all greedy (no logprobs, penalties, grammar or logits processors), capped by each row's
``max_tokens`` and the model length, and no ``sampling_params``: the model picks tokens itself.

The model runs its own drafter and verifies the drafts with its full forward pass, so each row's
tokens are exactly the greedy tokens plain decode steps would give. It returns int tokens
``[B, max_block_tokens]``: row ``r``'s committed tokens (at least 1 for a live row, at most
``block_tokens[r]``), then -1. Committing ``n`` tokens writes the KV of positions
``start_pos[r] .. start_pos[r] + n - 1`` (the input token and all committed tokens but the
last, as ``n`` plain decode steps would); it may write up to ``block_tokens[r]`` positions
from ``start_pos[r]`` (the scheduler reserves block size - 1 lookahead slots per row;
positions beyond the committed ones are overwritten later). Like a verify step it leaves no
token on the device for the next decode.

Warmup gets ``block_tokens=<block size>`` (``warmup_model_decode``) to capture the block
step's trace."""

MIXED_KWARGS: tuple[str, ...] = ("chunk_tokens", "chunk_start", "chunk_page_table", "chunk_slot", "chunk_completes")
"""``mixed_forward``'s prompt-chunk arguments (``mixed_shapes``; a mixed step). Its decode half
is a decode step's, as ``decode_forward`` takes it: ``tokens [B, 1]``, ``start_pos [B]`` (-1:
padding row), ``page_table [B, W]`` by slot over the full fixed batch, and
``page_tables_per_layer`` for a model that declared its KV spec. Its chunk half is one prefill
row, as ``prefill_forward`` takes it: ``chunk_tokens`` int ``[1, end]`` (the request's tokens up
to the chunk's end), ``chunk_start`` (the first position computed; before it the KV is cached),
``chunk_page_table [1, W]`` (and ``chunk_page_tables_per_layer``, one ``[1, W]`` per layer),
``chunk_slot`` (the request's decode slot) and ``chunk_completes`` (the chunk reaches the
prompt's end, so its last position's logits are wanted).

The runner sends it when the scheduler put live decode rows and one chunk in a step and the
counts fit a declared shape: at most ``D`` live decode rows and at most ``C`` chunk tokens for
some ``(D, C)`` in ``mixed_shapes``; the model runs that shape's program (padding the chunk to
``C``). The host samples a mixed step: no ``sampling_params`` are sent. It returns
``(decode_logits, chunk_logits)``: float ``[B, 1, V]`` by slot, exactly what ``decode_forward``
returns for the decode half (its live rows; a padding row's output means nothing), and float ``[1, 1, V]`` after the chunk's last token, exactly what
``prefill_forward`` returns for the chunk, or ``None`` when ``chunk_completes`` is false. The KV
written is the two calls' KV. Like a host-sampled decode it leaves no token on the device for
the next decode.

Warmup gets ``mixed_shapes=[(D, C), ...]`` (``warmup_model_decode``) to capture each shape's
program."""


@dataclass(frozen=True)
class CallShape:
    """How the runner calls one member: which arguments by position, which by keyword."""

    member: str
    positional: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    on_class: bool = False
    """Called on the class before any instance exists (must be a classmethod)."""
    sometimes: tuple[str, ...] = ()
    """Keywords sent only on some calls (the member takes them by name or ``**kwargs``)."""

    def render(self) -> str:
        args = list(self.positional) + [f"{k}=..." for k in self.keywords]
        return f"{self.member}({', '.join(args)})"


CALLS: Mapping[str, CallShape] = {
    c.member: c
    for c in (
        CallShape(
            "initialize_vllm_model",
            ("hf_config", "mesh_device", "max_batch_size"),
            ("max_seq_len", "tt_data_parallel", "optimizations"),
            on_class=True,
        ),
        CallShape("allocate_kv_cache", ("kv_cache_shape", "dtype", "num_layers")),
        CallShape(
            "prefill_forward",
            keywords=(
                "tokens",
                "page_table",
                "kv_cache",
                "prompt_lens",
                "start_pos",
                "empty_slots",
                "enable_trace",
            ),
            sometimes=("sampling_params", "page_tables_per_layer", "prompt_tokens", "output_tokens",
                       "return_all_logits", CROSS_PAGE_TABLE_KWARG, MM_POSITIONS_KWARG, *IMAGE_KWARGS, *VIDEO_KWARGS,
                       *AUDIO_KWARGS),
        ),
        CallShape(
            "decode_forward",
            keywords=(
                "tokens",
                "start_pos",
                "page_table",
                "kv_cache",
                "enable_trace",
                "read_from_device",
            ),
            sometimes=("sampling_params", "page_tables_per_layer", "prompt_tokens", "output_tokens",
                       "reset_batch", CROSS_PAGE_TABLE_KWARG, ROPE_DELTAS_KWARG, VERIFY_KWARG, BLOCK_KWARG),
        ),
        CallShape(
            "get_max_tokens_all_users",
            keywords=(
                "model_name",
                "num_devices",
                "tt_data_parallel",
                "max_model_len",
                "max_num_seqs",
            ),
            on_class=True,
        ),
        CallShape("get_kv_cache_spec", ("vllm_config",), on_class=True),
        CallShape("pool_forward", keywords=("tokens", "prompt_lens", "enable_trace"), sometimes=("token_type_ids",)),
        CallShape("warmup_model_pool", keywords=("shapes", "enable_trace")),
        CallShape("allocate_kv_cache_per_layer", ("per_layer_specs",)),
        CallShape("allocate_mtp_kv_cache", ("kv_cache_shape", "dtype")),
        CallShape("mtp_forward", keywords=("tokens", "start_pos", "num_valid_tokens", "page_table", "kv_cache",
                                           "num_drafts")),
        CallShape("allocate_eagle3_kv_cache", ("head_dir", "aux_layer_ids", "kv_cache_shape", "dtype")),
        CallShape("eagle3_forward", keywords=("tokens", "start_pos", "num_valid_tokens", "page_table", "kv_cache",
                                              "num_drafts")),
        CallShape("propose_drafts", keywords=("tokens", "start_pos", "page_table", "kv_cache", "num_drafts"),
                  sometimes=("page_tables_per_layer",)),
        CallShape("read_kv_blocks", keywords=("kv_cache", "lane", "layers", "block_ids")),
        CallShape("write_kv_blocks", keywords=("kv_cache", "lane", "layers", "block_ids", "pages")),
        CallShape(
            "mixed_forward",
            keywords=("tokens", "start_pos", "page_table", "kv_cache", *MIXED_KWARGS, "enable_trace"),
            sometimes=("page_tables_per_layer", "chunk_page_tables_per_layer"),
        ),
        CallShape("read_decode_output", ("tt_out",), ("async_read",)),
        CallShape("process_decode_output_host", ("tt_out",), ("is_tokens",)),
        CallShape("warmup_model_prefill", keywords=("kv_cache", "enable_trace", "can_sample_on_device")),
        CallShape(
            "warmup_model_decode",
            keywords=(
                "kv_cache",
                "enable_trace",
                "max_batch_size",
                "num_blocks",
                "can_sample_on_device",
            ),
            sometimes=("verify_tokens", BLOCK_KWARG, "mixed_shapes"),
        ),
    )
}
"""Every member the runner calls, with the arguments it always passes. Arguments passed
only sometimes (``sampling_params``, ``page_tables_per_layer``, ...) need ``**kwargs`` or an
explicit parameter; ``sampling_params`` is checked when ``supports_sample_on_device``."""

REQUIRED_METHODS: tuple[str, ...] = (
    "initialize_vllm_model",
    "allocate_kv_cache",
    "prefill_forward",
    "decode_forward",
)
"""Members every model class must define (``allocate_kv_cache_per_layer`` may stand in for
``allocate_kv_cache``)."""

POOLING_REQUIRED_METHODS: tuple[str, ...] = ("initialize_vllm_model", "pool_forward")
"""Members a pooling model class (``pooling_model``) must define instead: it has no decode and
no KV cache."""

OPTIONAL_METHODS: tuple[str, ...] = tuple(name for name in CALLS if name not in REQUIRED_METHODS)
"""Members a generation model may define (a pooling model's ``pool_forward`` among them)."""


def check_model_class(
    model_cls: Any, *, owner: str, overrides: Mapping[str, Any] | None = None
) -> ModelCapabilities:
    """Check ``model_cls`` against the contract and return its capabilities (the class's own
    ``model_capabilities`` with a registration's ``overrides`` on top).

    Raises :class:`ContractError` naming ``owner`` (a bundle folder or table entry), the
    member and what is wrong with it.
    """
    if not inspect.isclass(model_cls):
        raise ContractError(owner, f"{model_cls!r} is not a class", "point it at a class")
    name = model_cls.__qualname__
    try:
        capabilities = ModelCapabilities.of(model_cls, overrides)
    except ContractError as exc:
        raise ContractError(owner, f"class {name}.{exc.problem}", exc.fix) from exc
    required, kind = (POOLING_REQUIRED_METHODS, "pooling") if capabilities.pooling_model else (REQUIRED_METHODS, "")
    if capabilities.supports_pooling:
        required, kind = (*required, "pool_forward"), "supports_pooling"
    for member in required:
        if member == "allocate_kv_cache" and callable(
            getattr(model_cls, "allocate_kv_cache_per_layer", None)
        ):
            continue
        if not callable(getattr(model_cls, member, None)):
            raise ContractError(
                owner,
                f"class {name} has no method {member}()",
                f"implement {CALLS[member].render()}; every TT {kind + ' ' if kind else ''}model implements "
                f"{', '.join(required)} (docs/bundles.md, the TTModel protocol)",
            )
    for member, shape in CALLS.items():
        if hasattr(model_cls, member):
            _check_callable_as(model_cls, shape, owner)
    if capabilities.supports_sample_on_device:
        for member in ("prefill_forward", "decode_forward"):
            _check_callable_as(
                model_cls,
                CallShape(member, keywords=(*CALLS[member].keywords, "sampling_params")),
                owner,
                why="it declares supports_sample_on_device",
            )
    if capabilities.supports_mtp and not all(callable(getattr(model_cls, m, None))
                                             for m in ("allocate_mtp_kv_cache", "mtp_forward")):
        raise ContractError(
            owner, f"class {name} declares supports_mtp but lacks allocate_mtp_kv_cache() or mtp_forward()",
            f"implement {CALLS['allocate_mtp_kv_cache'].render()} and {CALLS['mtp_forward'].render()}, "
            "or drop the capability",
        )
    if capabilities.supports_eagle3 and not all(callable(getattr(model_cls, m, None))
                                                for m in ("allocate_eagle3_kv_cache", "eagle3_forward")):
        raise ContractError(
            owner, f"class {name} declares supports_eagle3 but lacks allocate_eagle3_kv_cache() or eagle3_forward()",
            f"implement {CALLS['allocate_eagle3_kv_cache'].render()} and {CALLS['eagle3_forward'].render()}, "
            "or drop the capability",
        )
    if capabilities.max_model_drafts and not callable(getattr(model_cls, "propose_drafts", None)):
        raise ContractError(
            owner, f"class {name} declares max_model_drafts but has no method propose_drafts()",
            f"implement {CALLS['propose_drafts'].render()}, or drop the capability",
        )
    if capabilities.mixed_shapes and not callable(getattr(model_cls, "mixed_forward", None)):
        raise ContractError(
            owner,
            f"class {name} declares mixed_shapes but has no method mixed_forward()",
            f"implement {CALLS['mixed_forward'].render()} or drop the capability",
        )
    if capabilities.supports_async_decode and not callable(getattr(model_cls, "read_decode_output", None)):
        raise ContractError(
            owner,
            f"class {name} declares supports_async_decode but has no method read_decode_output()",
            f"implement {CALLS['read_decode_output'].render()} or drop the capability",
        )
    missing = [m for m in KV_TRANSFER_METHODS if not callable(getattr(model_cls, m, None))]
    if capabilities.supports_kv_transfer and missing:
        raise ContractError(
            owner,
            f"class {name} declares supports_kv_transfer but has no method {missing[0]}()",
            f"implement {' and '.join(CALLS[m].render() for m in KV_TRANSFER_METHODS)} or drop the capability",
        )
    return capabilities


def _check_callable_as(model_cls: type, shape: CallShape, owner: str, why: str = "") -> None:
    """The member accepts the arguments the runner passes, and is bound the way it is called."""
    name = f"{model_cls.__qualname__}.{shape.member}"
    raw = inspect.getattr_static(model_cls, shape.member)
    if shape.on_class and not isinstance(raw, (classmethod, staticmethod)):
        raise ContractError(
            owner,
            f"{name} must be a classmethod (the runner calls it on the class before any instance exists)",
            f"add @classmethod to {shape.member}",
        )
    if not callable(getattr(model_cls, shape.member)):
        raise ContractError(owner, f"{name} is not a method", f"implement {shape.render()} as a method")
    if isinstance(raw, (classmethod, staticmethod)):
        receiver: tuple[Any, ...] = ()
    elif inspect.isfunction(raw):
        receiver = (None,)  # the instance
    else:
        return  # a callable object or C function: its signature cannot be read reliably
    try:
        signature = inspect.signature(getattr(model_cls, shape.member))
    except (TypeError, ValueError):
        return
    args = receiver + (None,) * len(shape.positional)
    try:
        signature.bind(*args, **dict.fromkeys(shape.keywords))
    except TypeError as exc:
        reason = f" ({why})" if why else ""
        raise ContractError(
            owner,
            f"{name}{signature} cannot be called as {shape.render()}{reason}: {exc}",
            "accept these arguments (add **kwargs for the ones you ignore)",
        ) from exc
