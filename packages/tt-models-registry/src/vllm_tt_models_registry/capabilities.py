"""What a model declares about itself, so that no behaviour is keyed on a class or model name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from vllm_tt_models_registry.errors import ContractError

_FIX = "declare model_capabilities as a dict of the ModelCapabilities fields with those types"

KV_CACHE_KINDS = ("full_attention", "sliding_window", "mla", "recurrent_state", "cross_attention")
"""The KV cache kinds a model may hold: vLLM's full-attention, sliding-window, latent-attention
(MLA) and recurrent-state (Mamba-family) specs."""

MODALITIES = ("image", "video", "audio")
"""The multimodal inputs the contract carries to ``prefill_forward`` (``contract.IMAGE_KWARGS``,
``contract.VIDEO_KWARGS``, ``contract.AUDIO_KWARGS``)."""

_CHOICE_LISTS = {"kv_cache_kinds": KV_CACHE_KINDS, "modalities": MODALITIES}
"""Capabilities that are a non-empty list drawn from a fixed vocabulary (kept in its order)."""


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model declares in its class-level ``model_capabilities`` mapping.

    A registration (a bundle's metadata, a builtin table entry) may add to it. Behaviour is
    keyed on these flags only, never on class or model names.
    """

    supports_sample_on_device: bool = False
    """The model can finish a step with token selection and return token ids."""
    supports_async_decode: bool = False
    """``decode_forward(read_from_device=False)`` does not block and ``read_decode_output``
    starts a non-blocking readback; the device keeps its own last token between steps."""
    supports_prefix_caching: bool = False
    """Prefill accepts ``start_pos > 0`` for tokens whose KV is already cached."""
    single_program_lanes: bool = False
    """One program over the whole mesh holding one KV cache per lane: ``--data-parallel-size``
    becomes in-process lanes instead of engine processes."""
    max_device_top_k: int = 32
    """Largest top-k the device sampler can express; larger values fall back to host."""
    supports_device_penalties: bool = True
    """Presence/frequency/repetition penalties are applied by the device sampler."""
    max_device_logprobs: int = 0
    """How many top logprobs the device returns besides the sampled token's own."""
    supports_prompt_logprobs: bool = False
    """``prefill_forward(return_all_logits=True)`` returns logits for every computed position
    (``[B, T, V]``, right-aligned), so the runner can serve ``prompt_logprobs``; without it
    such requests are rejected up front instead of silently getting none."""
    supports_verify_decode: bool = False
    """``decode_forward`` runs verify steps of speculative decoding: ``tokens [B, 1 + K]`` with
    ``num_valid_tokens`` (the contract's ``VERIFY_KWARG``) returns logits ``[B, 1 + K, V]``
    after every position, writing the KV of every real one; needed for ``--speculative-config``."""
    max_verify_tokens: int = 0
    """Longest verify step (``1 + K`` tokens per row) the model captures a trace for; 0: any.
    A ``num_speculative_tokens`` beyond it is refused at startup."""
    supports_mtp: bool = False
    """The model runs its checkpoint's multi-token-prediction module on the mesh
    (``--speculative-config method mtp``): ``allocate_mtp_kv_cache(shape, dtype)`` gives the
    module its KV pages (the target's layer shape, one page per target block) and makes the
    target's steps keep their final hidden states on the device; ``mtp_forward(tokens,
    start_pos, num_valid_tokens, page_table, kv_cache, num_drafts)`` reads them and returns
    draft ids ``[B, num_drafts]``; ``mtp_layers`` says how many modules the loaded checkpoint
    has (0: its MTP weights are absent)."""
    supports_eagle3: bool = False
    """The model serves an EAGLE-3 head (``--speculative-config method eagle3``):
    ``allocate_eagle3_kv_cache(head_dir, aux_layer_ids, shape, dtype)`` loads the head named by
    vLLM's speculative config, gives it its paged KV (one page per target block) and makes the
    target's prefill, decode and verify steps keep the auxiliary hidden states of the layers
    ``aux_layer_ids`` names on the device (vLLM's ``eagle_aux_hidden_state_layer_ids``: the
    residual stream entering each layer); ``eagle3_forward(tokens, start_pos, num_valid_tokens,
    page_table, kv_cache, num_drafts)`` returns ``num_drafts`` chained draft ids per row."""
    max_block_tokens: int = 0
    """Adaptive block output: the model speculates inside ``decode_forward`` with a drafter of
    its own and commits up to this many tokens per row per decode step (0: none). Sent the
    contract's ``BLOCK_KWARG``, it verifies its drafts greedily and returns int tokens ``[B, W]``
    (``W`` = this value), each row's committed tokens first, then -1; switched on by the
    operator with ``--additional-config.tt.block_tokens``."""
    max_model_drafts: int = 0
    """The model's own drafter (the reference plugin's ``custom_class`` rail): after each step
    ``propose_drafts(tokens, start_pos, page_table, kv_cache, num_drafts)`` returns up to this
    many draft ids per row after the row's last token (int ``[B, W]``, -1 beyond a row's
    ``num_drafts``), which ordinary verify steps then check (0: none). It may write KV at the
    drafts' positions (the scheduler reserves K lookahead slots per row; verify steps overwrite
    them) and leaves the device's decode inputs as they were. Served with ``--speculative-config
    method custom_class`` naming the platform's ``ModelDrafts`` proposer."""
    prefill_trace_lens: tuple[int, ...] = ()
    """Prefill lengths the model captures traces for; the scheduler chunks to these."""
    mixed_shapes: tuple[tuple[int, int], ...] = ()
    """Mixed steps: the ``(decode_rows, chunk_tokens)`` shapes the model captures one program
    for, holding up to ``decode_rows`` live decode rows and one prompt chunk of up to
    ``chunk_tokens`` tokens (``mixed_forward``, the contract's ``MIXED_CALL``). Empty (the
    default): every step is prefill-only or decode-only."""
    pooling_model: bool = False
    """A pooling model (embeddings, rerankers, classifiers; served with ``--runner pooling``):
    it runs prefill-only programs through ``pool_forward`` at fixed (batch, length) shapes and
    has no decode and no KV cache (``decode_forward`` and ``allocate_kv_cache`` are not called)."""
    pooled_outputs: bool = False
    """A pooling model whose ``pool_forward`` applies its own head and returns one vector per
    row ``[B, D]`` (a sequence classifier's logits, e.g. a cross-encoder reranker's score)
    instead of hidden states; served as vLLM's ``classify`` task (``/classify``, ``/score``,
    ``/rerank``)."""
    supports_kv_transfer: bool = False
    """``read_kv_blocks`` / ``write_kv_blocks`` copy KV blocks of any kind the model holds
    between the mesh and host memory, asynchronously: what vLLM's KV offloading
    (``--kv-offloading-size``) is served through."""
    supports_pooling: bool = False
    """A generation model that also runs prefill-only ``pool_forward`` (whole prompts, no KV
    cache kept, returning the final-norm hidden states ``[B, L, H]``), so ``--runner pooling``
    (vLLM's ``--convert embed``) serves it as an embedding model, e.g. Qwen3-Embedding with
    vLLM's LAST pooling."""
    kv_cache_kinds: tuple[str, ...] = ("full_attention",)
    """The KV cache kinds its layers hold (``KV_CACHE_KINDS``); anything beyond full attention
    needs ``get_kv_cache_spec`` (per-layer specs, one page table per layer)."""
    modalities: tuple[str, ...] = ("image",)
    """The multimodal inputs (``MODALITIES``) a model vLLM recognises as multimodal takes; vLLM's
    front end refuses a request with any other (its limit per prompt is set to 0)."""
    chunked_mm_input: bool = False
    """A prefill chunk may end, and the next start, inside an item's placeholder tokens: the
    model embeds the item whole on each pass (every pass carries it) and places the part the
    chunk computes, which needs item tokens that attend causally. Off, vLLM never splits an
    item over chunks (``disable_chunked_mm_input``). vLLM's ``align`` mode (prefix caching of a
    recurrent-state model) ends chunks on block boundaries, inside an item if need be, so such
    a multimodal model needs it to declare ``supports_prefix_caching``."""

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None, *, owner: str) -> ModelCapabilities:
        """Parse a ``model_capabilities`` mapping; unknown keys are ignored (tt-metal adds
        keys over time), wrong types are an error naming ``owner``."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ContractError(owner, f"model_capabilities must be a dict, got {type(raw).__name__}", _FIX)
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in raw:
                continue
            value = raw[f.name]
            if f.name == "prefill_trace_lens":
                if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
                ):
                    raise ContractError(
                        owner,
                        f"model_capabilities['prefill_trace_lens'] must be a list of positive "
                        f"ints, got {value!r}",
                        _FIX,
                    )
                value = tuple(sorted(value))
            elif f.name == "mixed_shapes":
                value = _mixed_shapes(value, owner)
            elif (choices := _CHOICE_LISTS.get(f.name)) is not None:
                if not isinstance(value, (list, tuple)) or not value or not all(v in choices for v in value):
                    raise ContractError(
                        owner,
                        f"model_capabilities['{f.name}'] must be a non-empty list of "
                        f"{', '.join(choices)}, got {value!r}",
                        _FIX,
                    )
                value = tuple(v for v in choices if v in value)
            elif f.type == "bool" and not isinstance(value, bool):
                raise ContractError(
                    owner,
                    f"model_capabilities[{f.name!r}] must be true or false, got {value!r}",
                    _FIX,
                )
            elif f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ContractError(
                    owner, f"model_capabilities[{f.name!r}] must be an int, got {value!r}", _FIX
                )
            values[f.name] = value
        return cls(**values)

    @classmethod
    def of(cls, model_cls: type, overrides: Mapping[str, Any] | None = None) -> ModelCapabilities:
        """The class's declared capabilities, with a registration's ``overrides`` on top."""
        declared = getattr(model_cls, "model_capabilities", None)
        owner = model_cls.__qualname__
        if declared is not None and not isinstance(declared, Mapping):
            return cls.from_mapping(declared, owner=owner)  # raises, naming the owner
        return cls.from_mapping({**(declared or {}), **(overrides or {})}, owner=owner)

    def non_defaults(self) -> dict[str, Any]:
        """The flags that differ from the defaults (what is worth showing a user)."""
        default = ModelCapabilities()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON schema of a ``capabilities`` object in bundle metadata (no unknown keys:
        a typo there must not silently turn a feature off)."""
        props: dict[str, Any] = {}
        for f in fields(cls):
            if f.type == "bool":
                props[f.name] = {"type": "boolean"}
            elif f.type == "int":
                props[f.name] = {"type": "integer", "minimum": 0}
            elif (choices := _CHOICE_LISTS.get(f.name)) is not None:
                props[f.name] = {"type": "array", "minItems": 1, "items": {"enum": list(choices)}}
            elif f.name == "mixed_shapes":
                pair = {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 1}}
                props[f.name] = {"type": "array", "items": pair}
            else:
                props[f.name] = {"type": "array", "items": {"type": "integer", "minimum": 1}}
        return {"type": "object", "additionalProperties": False, "properties": props}


def _mixed_shapes(value: Any, owner: str) -> tuple[tuple[int, int], ...]:
    """``mixed_shapes`` as sorted ``(decode_rows, chunk_tokens)`` pairs of positive ints."""
    def positive(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if not isinstance(value, (list, tuple)) or not all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 and all(positive(v) for v in pair) for pair in value
    ):
        raise ContractError(
            owner,
            f"model_capabilities['mixed_shapes'] must be a list of [decode_rows, chunk_tokens] pairs of "
            f"positive ints, got {value!r}",
            _FIX,
        )
    return tuple(sorted({(int(d), int(c)) for d, c in value}))
