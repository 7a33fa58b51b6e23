"""The TT model contract: what a model class must provide to be served by vllm-tt.

It is the interface tt-metal's generator classes (``models/tt_transformers/tt/generator_vllm.py``)
already implement, so those classes drop in unchanged. Everything the runner calls is listed
here once; the registry checks a class against it when the class is registered.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, runtime_checkable


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model declares about itself in its class-level ``model_capabilities`` mapping.

    Behaviour is keyed on these flags only, never on class or model names.
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
    prefill_trace_lens: tuple[int, ...] = ()
    """Prefill lengths the model captures traces for; the scheduler chunks to these."""

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None, *, owner: str) -> ModelCapabilities:
        """Parse a ``model_capabilities`` mapping; unknown keys are ignored (tt-metal adds
        keys over time), wrong types are an error naming ``owner``."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ContractError(f"{owner}.model_capabilities must be a dict, got {type(raw).__name__}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in raw:
                continue
            value = raw[f.name]
            if f.name == "prefill_trace_lens":
                if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, int) and v > 0 for v in value
                ):
                    raise ContractError(
                        f"{owner}.model_capabilities['prefill_trace_lens'] must be a list of "
                        f"positive ints, got {value!r}"
                    )
                value = tuple(sorted(value))
            elif f.type == "bool" and not isinstance(value, bool):
                raise ContractError(
                    f"{owner}.model_capabilities[{f.name!r}] must be true or false, got {value!r}"
                )
            elif f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ContractError(
                    f"{owner}.model_capabilities[{f.name!r}] must be an int, got {value!r}"
                )
            values[f.name] = value
        return cls(**values)

    @classmethod
    def of(cls, model_cls: type) -> ModelCapabilities:
        return cls.from_mapping(
            getattr(model_cls, "model_capabilities", None), owner=model_cls.__qualname__
        )


class ContractError(TypeError):
    """A model class does not satisfy the TT model contract."""


@runtime_checkable
class TTModel(Protocol):
    """A TT model ("generator"), as tt-metal's ``generator_vllm.py`` classes implement it.

    All forward and warmup calls pass keyword arguments; implementations should accept
    ``**kwargs`` so that new optional arguments do not break them.
    """

    model_capabilities: ClassVar[Mapping[str, Any]]

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
        ``(num_blocks, num_kv_heads, block_size, head_dim)``. The result is opaque to the runner."""
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
        ``(tokens, logprobs)`` when ``sampling_params`` is given) for position ``prompt_len-1``."""
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
        (optionally with logprobs), or a device handle when ``read_from_device`` is false."""
        ...


REQUIRED_METHODS: tuple[str, ...] = (
    "initialize_vllm_model",
    "allocate_kv_cache",
    "prefill_forward",
    "decode_forward",
)
"""Members every model class must define (``allocate_kv_cache_per_layer`` may stand in for
``allocate_kv_cache``)."""

OPTIONAL_METHODS: tuple[str, ...] = (
    "allocate_kv_cache_per_layer",
    "read_decode_output",
    "process_decode_output_host",
    "warmup_model_prefill",
    "warmup_model_decode",
    "get_max_tokens_all_users",
    "get_kv_cache_spec",
)


def check_model_class(model_cls: Any, *, owner: str) -> ModelCapabilities:
    """Check ``model_cls`` against the contract and return its declared capabilities.

    Raises :class:`ContractError` naming ``owner`` (a bundle folder or table entry) and the
    missing member.
    """
    if not inspect.isclass(model_cls):
        raise ContractError(f"{owner}: {model_cls!r} is not a class")
    for name in REQUIRED_METHODS:
        if name == "allocate_kv_cache" and hasattr(model_cls, "allocate_kv_cache_per_layer"):
            continue
        member = getattr(model_cls, name, None)
        if member is None or not callable(member):
            raise ContractError(
                f"{owner}: class {model_cls.__qualname__} has no method {name}(); "
                f"every TT model must implement {', '.join(REQUIRED_METHODS)}"
            )
    init = inspect.getattr_static(model_cls, "initialize_vllm_model")
    if not isinstance(init, classmethod):
        raise ContractError(
            f"{owner}: {model_cls.__qualname__}.initialize_vllm_model must be a classmethod"
        )
    return ModelCapabilities.of(model_cls)
