"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``) on the host decoder.

The text side is the Qwen 2 decoder with multimodal rotary positions (mRoPE): every position
has a temporal, a height and a width index, and the rotated pairs of a head are split into
``mrope_section`` groups turning with one index each. Text tokens have three equal indices
(plain RoPE); an image's ``t * h * w / merge**2`` placeholder tokens (``image_token_id``) get
the image's grid coordinates, all offset by where the image starts, and the text after it
continues from the largest of them plus one. A prompt's positions thus end ``rope_delta``
away from its length; decode rotates token ``p`` at ``p + rope_delta`` (the contract's
``rope_deltas_all_users``), and ``prefill_forward`` returns ``(out, rope_deltas)``.

Images: each image's pixel values run through the vision tower (``qwen2_5_vl_vision``) and its
merged patch vectors replace the embeddings of its placeholder tokens. A prefill pass (a chunk,
a resume, a prefix-cache hit) gets all the row's images and computes the towers of those whose
placeholders it covers; the positions of a later chunk come from the images before it, so
from their grids alone: vLLM sends an image inside the prefix-cache hit with its
``image_grid_thw`` but no pixels.

All of that is the Qwen-VL frame (``QwenVLConfig``, ``QwenVLDecoder``, ``HostQwenVLModel``),
which Qwen3-VL (``qwen3_vl``) shares; Qwen2.5-VL names its tower and contiguous mRoPE groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration as VllmQwen2_5_VL
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import (
    DecoderWeights,
    WeightFolder,
    load_decoder_weights,
)
from vllm_tt_host.models.frame.config import DecoderConfig, model_name
from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.models.frame.inputs import PrefillRow
from vllm_tt_host.models.frame.patch_grid import PatchGridConfig
from vllm_tt_host.models.frame.rope import apply_rotary, inverse_frequencies
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import PixelNorm, computed_pixels
from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.qwen2_5_vl.media import Media, mrope_positions, row_media
from vllm_tt_host.models.qwen2_5_vl.vision import (
    VisionConfig,
    VisionTower,
    load_vision_weights,
)

TEXT_PREFIXES: tuple[str, ...] = ("model.", "model.language_model.")
"""Where checkpoints keep the text decoder (transformers 5 saves Qwen2.5-VL with the first)."""
VISION_PREFIXES: tuple[str, ...] = ("visual.", "model.visual.")


@dataclass(frozen=True)
class QwenVLConfig(DecoderConfig):
    """What a Qwen-VL decoder reads beyond a text decoder: its mRoPE sections, the image token
    and its tower's config (``vision_type`` reads it)."""

    mrope_section: tuple[int, ...] = ()
    """Rotated pairs per index (temporal, height, width); sums to ``head_dim / 2``."""
    vision: PatchGridConfig = field(kw_only=True)
    image_token_id: int = -1
    video_token_id: int = -1
    """-1: the checkpoint names no video token (its videos cannot be placed)."""
    tokens_per_second: float = 1.0
    """mRoPE temporal steps per second of video (Qwen2.5-VL's ``vision_config.tokens_per_second``)."""

    vision_type: ClassVar[type[PatchGridConfig]]
    interleaved_mrope: ClassVar[bool] = False
    """Which index turns each rotated pair: contiguous groups of ``mrope_section`` (Qwen2.5-VL),
    or interleaved t, h, w, t, h, w... up to each section's share (Qwen3-VL)."""
    video_frame_runs: ClassVar[bool] = False
    """Whether a video fills one placeholder run (Qwen2.5-VL) or one per temporal patch, with its
    timestamp text between them (Qwen3-VL; ``media.item_runs``)."""

    @property
    def merge_size(self) -> int:
        return self.vision.merge_size

    @classmethod
    def read(cls, hf_config: Any, family: str = "qwen2", *, n_layers: int | None = None) -> Self:
        base = DecoderConfig.read(text_and_vision(hf_config)[0], family, n_layers=n_layers)
        return cls(**(config_fields(base) | cls.vl_fields(hf_config, base.head_dim // 2)))

    @classmethod
    def vl_fields(cls, hf_config: Any, rotary_pairs: int) -> dict[str, Any]:
        """What a Qwen-VL checkpoint adds to its text decoder's config, read from the whole
        ``hf_config``; its mRoPE sections must share out the ``rotary_pairs`` rotated pairs."""
        model = model_name(hf_config)
        text, vision = text_and_vision(hf_config)
        section = tuple(int(s) for s in (getattr(text, "rope_parameters", None) or {}).get("mrope_section") or ())
        if len(section) != 3 or sum(section) != rotary_pairs:
            raise TTConfigError(f"{model}: rope_parameters.mrope_section", list(section),
                                f"three pair counts summing to the {rotary_pairs} rotated pairs of a head",
                                "check the checkpoint's config.json")
        image_token = getattr(hf_config, "image_token_id", None)
        if not isinstance(image_token, int) or image_token < 0:
            raise TTConfigError(f"{model}: image_token_id", image_token, "a token id", "check config.json")
        video_token = getattr(hf_config, "video_token_id", None)
        return {"tie_word_embeddings": bool(getattr(hf_config, "tie_word_embeddings", False)),
                "mrope_section": section, "vision": cls.vision_type.from_hf(vision), "image_token_id": image_token,
                "video_token_id": video_token if isinstance(video_token, int) else -1,
                "tokens_per_second": float(getattr(vision, "tokens_per_second", None) or 1.0)}

    def mrope_axes(self) -> torch.Tensor:
        """``[head_dim / 2]``: which index (0 t, 1 h, 2 w) turns each rotated pair."""
        t, h, w = self.mrope_section
        if not self.interleaved_mrope:
            return torch.repeat_interleave(torch.arange(3), torch.tensor([t, h, w]))
        axes = torch.zeros(t + h + w, dtype=torch.long)
        axes[1 : 3 * h : 3] = 1
        axes[2 : 3 * w : 3] = 2
        return axes


def text_and_vision(hf_config: Any) -> tuple[Any, Any]:
    """A Qwen-VL checkpoint's ``text_config`` and ``vision_config``, both required."""
    text = getattr(hf_config, "text_config", None)
    vision = getattr(hf_config, "vision_config", None)
    if text is None or vision is None:
        raise TTConfigError(f"{model_name(hf_config)}: text_config/vision_config", None, "both present",
                            "serve a Qwen-VL checkpoint saved by transformers")
    return text, vision


def config_fields(config: DecoderConfig) -> dict[str, Any]:
    """Every field of ``config``, for a config class that extends it."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


@dataclass(frozen=True)
class Qwen25VLConfig(QwenVLConfig):
    vision: VisionConfig = field(kw_only=True)
    vision_type = VisionConfig


class MultimodalRotary:
    """mRoPE for every layer of one decoder; the positions of the call in progress are set
    around it (``at`` for a prefill row, ``shifted`` for a decode batch)."""

    def __init__(self, config: QwenVLConfig, rotary_dim: int | None = None) -> None:
        """``rotary_dim``: the leading dimensions of each head that turn (the whole head by default)."""
        self.inv_freq = inverse_frequencies(config.rope, rotary_dim or config.head_dim)
        self.axes = config.mrope_axes()
        self._positions: torch.Tensor | None = None
        self._deltas: torch.Tensor | None = None

    @contextlib.contextmanager
    def at(self, positions: torch.Tensor) -> Iterator[None]:
        """``positions [3, T]``: the indices of the ``T`` query rows the next calls rotate."""
        self._positions = positions
        try:
            yield
        finally:
            self._positions = None

    @contextlib.contextmanager
    def shifted(self, deltas: torch.Tensor) -> Iterator[None]:
        """Decode: row ``r``'s token at position ``p`` is rotated at ``p + deltas[r]``."""
        self._deltas = deltas
        try:
            yield
        finally:
            self._deltas = None

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [T, heads, d]``; ``positions [T]`` are the cache positions."""
        if self._positions is not None:
            indices = self._positions
        elif self._deltas is not None:
            indices = (positions + self._deltas)[None].expand(3, -1)
        else:
            raise RuntimeError("MultimodalRotary used outside at()/shifted(): no mRoPE positions for the call")
        if indices.shape[1] != x.shape[0]:
            raise HostModelInputError(f"mRoPE positions cover {indices.shape[1]} rows, the call has {x.shape[0]}")
        freqs = indices[..., None].to(torch.float32) * self.inv_freq  # [3, T, d/2]
        chosen = freqs.gather(0, self.axes.expand(1, freqs.shape[1], -1))[0]
        angles = torch.cat((chosen, chosen), dim=-1)[:, None, :]
        return apply_rotary(x, angles.cos(), angles.sin())


@dataclass(frozen=True)
class MropeInserts(PrefillInserts):
    """A row's image embeddings plus the mRoPE indices of the positions it computes."""

    positions: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(3, 0, dtype=torch.long))
    """``[3, end - start]``."""
    delta: int = 0
    """``max index + 1 - end`` over the row's tokens so far: its decode position offset."""


class QwenVLDecoder(HostDecoder):
    """A Qwen-VL text decoder with its vision tower: mRoPE on every layer, image features in
    place of the placeholder embeddings. A family names its tower (``load_tower``) and what
    an image gives the decoder (``encode``)."""

    config: QwenVLConfig
    pads_prefill: ClassVar[bool] = True
    """Whether a prefill row computes its whole bucket (the mRoPE indices padded to it) or its
    real tokens only (a text side over a recurrent state, which padding would advance)."""

    def __init__(self, config: QwenVLConfig, weights: DecoderWeights, tower: Any) -> None:
        super().__init__(config, weights)
        self.attach_vision(tower)

    def attach_vision(self, tower: Any, rotary_dim: int | None = None) -> None:
        """The tower, and mRoPE (over ``rotary_dim`` of each head) on every layer."""
        self.tower = tower
        self.mrope = MultimodalRotary(self.config, rotary_dim)
        self.rotaries = (self.mrope,) * self.config.num_layers  # type: ignore[assignment]
        self.slot_deltas = torch.zeros(0, dtype=torch.long)
        """Each decode slot's mRoPE delta (set by the model: its prefills, ``rope_deltas_all_users``)."""

    @classmethod
    def load(cls, folder: Path, config: Any) -> HostDecoder:
        reader = WeightFolder(folder)
        text = reader.prefix(TEXT_PREFIXES, "embed_tokens.weight", "text decoder")
        vision = reader.prefix(VISION_PREFIXES, "patch_embed.proj.weight", "vision tower")
        tower = cls.load_tower(reader, vision, config, PixelNorm.of_checkpoint(folder))
        return cls.with_text(folder, config, text, tower)

    @classmethod
    def with_text(cls, folder: Path, config: Any, text_prefix: str, tower: Any) -> HostDecoder:
        """This decoder from the text weights under ``text_prefix`` and ``tower``; a family
        whose text side is not the frame's decoder loads it here."""
        return cls(config, load_decoder_weights(folder, config, text_prefix), tower)

    @classmethod
    def load_tower(cls, reader: WeightFolder, prefix: str, config: Any, norm: PixelNorm) -> Any:
        raise NotImplementedError

    def encode(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        """One image's ``[tokens, hidden]`` features for its placeholders, then what each of
        the first layers adds at them (``PrefillInserts.layer_adds``)."""
        raise NotImplementedError

    def prefill(self, new_tokens: torch.Tensor, start: int, bucket: int, page_rows: Any, lane_kv: Any,
                all_positions: bool = False, inserts: PrefillInserts | None = None) -> torch.Tensor:
        if not isinstance(inserts, MropeInserts):
            raise HostModelInputError("a Qwen-VL prefill row needs its mRoPE positions (MropeInserts)")
        positions = inserts.positions
        if self.pads_prefill:
            positions = torch.cat((positions, positions[:, -1:].expand(3, bucket - positions.shape[1])), dim=1)
        with self.mrope.at(positions):
            return super().prefill(new_tokens, start, bucket, page_rows, lane_kv, all_positions, inserts)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, page_tables: Any, kv: Any,
               rows_per_lane: int) -> torch.Tensor:
        """Row ``r`` (slot ``r``) rotates at its position plus ``slot_deltas[r]``."""
        with self.mrope.shifted(self.slot_deltas):
            return super().decode(tokens, positions, page_tables, kv, rows_per_lane)

    def row_inserts(self, ids: torch.Tensor, start: int, media: list[Media], row: int,
                    run_tower: bool = True) -> MropeInserts:
        """Row ``row``'s inputs for computing ``[start, len(ids))`` of the token history ``ids``
        (``run_tower`` false: positions only, for synthetic tokens)."""
        positions, runs = mrope_positions(ids, media, self.config)
        live = list(dict.fromkeys(r.item for r in runs if r.stop > start and run_tower))  # others: KV cached
        pixels = computed_pixels({k: media[k].pixels for k in live}, row, start)
        features = {k: self.encode(p, media[k].grid) for k, p in zip(live, pixels, strict=True)}
        index, parts = [], []
        for run in runs:
            if run.item not in features or run.stop <= start:
                continue
            lo = max(run.first, start)
            index.append(torch.arange(lo, run.stop) - start)
            parts.append([f[run.offset + lo - run.first : run.offset + run.stop - run.first]
                          for f in features[run.item]])
        end = ids.shape[0]
        stacked = [torch.cat(p) for p in zip(*parts, strict=True)] or [torch.zeros(0, self.config.hidden_size)]
        return MropeInserts(
            index=torch.cat(index) if index else torch.zeros(0, dtype=torch.long),
            vectors=stacked[0], layer_adds=tuple(stacked[1:]),
            blocks=torch.full((end,), -1, dtype=torch.long),
            positions=positions[:, start:], delta=int(positions.max()) + 1 - end,
        )


class Qwen25VLDecoder(QwenVLDecoder):
    config: Qwen25VLConfig
    tower: VisionTower

    @classmethod
    def load_tower(cls, reader: WeightFolder, prefix: str, config: Qwen25VLConfig, norm: PixelNorm) -> VisionTower:
        return VisionTower(config.vision, load_vision_weights(reader, prefix, config.vision), norm)

    def encode(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        return (self.tower(pixels, grid),)


class HostQwenVLModel(HostCausalLM):
    """A Qwen-VL model through the contract: prefill rows carry ``pixel_values`` +
    ``image_grid_thw``; prefill returns ``(out, rope_deltas)``, decode takes
    ``rope_deltas_all_users``. A family names its config, decoder and vLLM processor."""

    decoder: QwenVLDecoder
    model_capabilities: ClassVar[dict[str, Any]] = {
        **HostCausalLM.model_capabilities,
        "supports_async_decode": False,  # decode rotates with the host's positions
        "supports_verify_decode": False,  # verify steps over image rows (their rope deltas): not proven yet
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoder.slot_deltas = torch.zeros(self.max_batch_size, dtype=torch.long)
        self._call_deltas: list[int] = []
        """The deltas of the prefill call in progress (``prefill_inserts`` computes them)."""

    def prefill_inserts(self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any],
                        ) -> list[PrefillInserts | None]:
        media = row_media(kwargs, len(rows))
        inserts = [self.decoder.row_inserts(tokens[i, : row.end].long(), row.start, media[i], i,
                                            run_tower=self.synthetic is None)
                   for i, row in enumerate(rows)]
        self._call_deltas = [i.delta for i in inserts]
        return list(inserts)

    def prefill_forward(self, tokens: Any, page_table: Any, kv_cache: Any, prompt_lens: Any, start_pos: Any = None,
                        empty_slots: Any = None, sampling_params: Any = None, enable_trace: bool = False,
                        **kwargs: Any) -> tuple[Any, torch.Tensor]:
        """As ``HostCausalLM.prefill_forward``, plus each row's mRoPE delta: ``(out, rope_deltas [B])``."""
        out = super().prefill_forward(tokens, page_table, kv_cache, prompt_lens, start_pos, empty_slots,
                                      sampling_params, enable_trace, **kwargs)
        deltas = torch.tensor(self._call_deltas, dtype=torch.long)
        count = torch.as_tensor(tokens).shape[0]
        slots = list(range(count)) if empty_slots is None else [int(s) for s in empty_slots]
        self.decoder.slot_deltas[slots] = deltas
        return out, deltas

    def decode_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, enable_trace: bool = False,
                       read_from_device: bool = True, sampling_params: Any = None, prompt_tokens: Any = None,
                       output_tokens: Any = None, reset_batch: bool = False, **kwargs: Any) -> Any:
        """As ``HostCausalLM.decode_forward``; ``rope_deltas_all_users`` (one int per slot), when
        sent, replaces the deltas the prefills left."""
        deltas = kwargs.pop("rope_deltas_all_users", None)
        if deltas is not None:
            if len(deltas) != self.max_batch_size:
                raise HostModelInputError(
                    f"rope_deltas_all_users has {len(deltas)} entries, the decode batch {self.max_batch_size}"
                )
            self.decoder.slot_deltas = torch.tensor([int(d) for d in deltas], dtype=torch.long)
        return super().decode_forward(tokens, start_pos, page_table, kv_cache, enable_trace, read_from_device,
                                      sampling_params, prompt_tokens, output_tokens, reset_batch, **kwargs)


@vllm_multimodal_processing(VllmQwen2_5_VL)
class HostQwen2_5_VLForConditionalGeneration(HostQwenVLModel):
    """Qwen2.5-VL with images and videos: prefill rows carry ``pixel_values`` + ``image_grid_thw``
    and ``pixel_values_videos`` + ``video_grid_thw`` + ``second_per_grid_ts``; prefill returns
    ``(out, rope_deltas)``, decode takes ``rope_deltas_all_users``."""

    family = "qwen2"
    model_capabilities: ClassVar[dict[str, Any]] = {**HostQwenVLModel.model_capabilities, "modalities": ("image", "video")}
    config_type = Qwen25VLConfig
    decoder_type = Qwen25VLDecoder
    decoder: Qwen25VLDecoder
