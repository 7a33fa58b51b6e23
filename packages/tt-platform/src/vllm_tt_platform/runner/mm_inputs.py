"""A step's multimodal inputs, in the form the TT model contract takes them.

Prefill: each row's images and videos, gathered from the request's vLLM ``mm_features`` (prompt
order) into the row-aligned lists of :data:`~vllm_tt_models_registry.contract.IMAGE_KWARGS` and
``VIDEO_KWARGS`` and ``AUDIO_KWARGS`` (the model runs its own vision encoder: the contract has no encoder cache, so
every prefill pass of a row carries all its items). mRoPE: the position delta each prefill returns is kept on the request
(``RequestState.rope_delta``) and sent, slot-ordered, with every decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_tt_models_registry.capabilities import MODALITIES
from vllm_tt_models_registry.contract import (
    AUDIO_KWARGS,
    CALLS,
    IMAGE_KWARGS,
    MM_POSITIONS_KWARG,
    VIDEO_KWARGS,
)

from vllm_tt_platform.runner.batch import RequestState

_PREFILL_ARGUMENTS = ({*CALLS["prefill_forward"].keywords, *CALLS["prefill_forward"].sometimes}
                      - {*IMAGE_KWARGS, *VIDEO_KWARGS, *AUDIO_KWARGS}) | {MM_POSITIONS_KWARG}
"""``prefill_forward``'s own arguments: an image key of the same name would replace one of them."""


class MultimodalInputError(RuntimeError):
    """A request's multimodal item cannot be passed to the model (a broken invariant: vLLM's
    front end refuses the modalities ``config.startup_checks.restrict_modalities`` limits to 0)."""


def prefill_image_kwargs(states: Sequence[RequestState]) -> dict[str, list[list[Any] | None]]:
    """``{key: [row entry, ...]}`` for the prefill rows ``states`` (call order): ``None`` for a
    row without images or videos, else one tensor per item (``None`` where that item's processor
    output has no such key: an image's place in ``pixel_values_videos``, or vLLM did not send it: an image inside the prefix-cache hit comes without
    data), and ``MM_POSITIONS_KWARG``: every item's placeholder ``(offset, length)``. Empty when
    no row has an image: text-only steps send nothing."""
    rows: list[list[Any] | None] = []
    positions: list[list[tuple[int, int]] | None] = []
    keys: dict[str, None] = {}  # insertion-ordered set
    for state in states:
        images = [_image_data(state, index, f) for index, f in enumerate(state.mm_features)]
        rows.append(images or None)
        positions.append([(int(f.mm_position.offset), int(f.mm_position.length)) for f in state.mm_features]
                         or None)
        for item in images:
            keys.update(dict.fromkeys(item))
    reserved = _PREFILL_ARGUMENTS & set(keys)
    if reserved:
        raise MultimodalInputError(
            f"the multimodal processor produced {sorted(reserved)}, which prefill_forward already "
            "takes as its own arguments"
        )
    if not any(rows):
        return {}
    return {
        **{key: [None if images is None else [item[key].data if key in item else None for item in images]
                 for images in rows]
           for key in keys},
        MM_POSITIONS_KWARG: positions,
    }


def _image_data(state: RequestState, index: int, feature: Any) -> Any:
    if feature.modality not in MODALITIES:
        raise MultimodalInputError(
            f"request {state.req_id!r} item {index} is {feature.modality!r}; TT models are sent "
            f"{', '.join(MODALITIES)} only"
        )
    if feature.data is None:
        position = feature.mm_position
        if position.offset + position.length <= state.num_computed_tokens:
            # vLLM strips the data of an image inside the request's prefix-cache hit
            # (strip_covered_mm_data): its tokens are in the KV cache, no pass computes them.
            return {}
        raise MultimodalInputError(
            f"request {state.req_id!r} image {index} reached the runner without its processed data "
            "(vLLM's engine-side multimodal cache should have filled it in)"
        )
    return feature.data


def record_rope_deltas(states: Sequence[RequestState], rope_deltas: Any) -> None:
    """Keep each prefill row's mRoPE delta on its request (``rope_deltas[i]`` is row ``i``'s)."""
    if len(rope_deltas) != len(states):
        raise MultimodalInputError(
            f"prefill_forward returned {len(rope_deltas)} rope deltas for {len(states)} rows"
        )
    for state, delta in zip(states, rope_deltas, strict=True):
        state.rope_delta = int(delta)


def decode_rope_deltas(states: Sequence[RequestState], num_slots: int) -> list[int]:
    """What ``ROPE_DELTAS_KWARG`` carries: every slot's delta (0 for free slots), slot order,
    the full fixed decode batch."""
    deltas = [0] * num_slots
    for state in states:
        deltas[state.slot] = state.rope_delta
    return deltas
