"""Gemma 4 vision-language (``Gemma4ForConditionalGeneration``) on the host Gemma 4 decoder.

The text side is Gemma 4 text (``gemma4``: hybrid KV, KV-shared layers, per-layer input
embeddings); what the images add happens only in prefill. Each image runs through the Gemma 4
vision tower (``vision``) at its own patch grid and becomes as many vectors as the processor
wrote image tokens for it (between its begin and end markers); they replace those tokens'
embeddings (unscaled). Every image, video or audio placeholder token embeds, and looks up its
per-layer input, as the pad token, as transformers does; the per-layer inputs' projected half
reads the image vectors. With ``use_bidirectional_attention: "vision"`` the tokens of one image
attend to each other both ways on the sliding layers only (the full layers stay causal);
without it every layer is causal. Decode is the text model's.

vLLM sends each image as its processor made it: ``pixel_values [patches, 3 * P * P]`` (floats
in ``[0, 1]``, padded to the patch budget) and ``pixel_position_ids [patches, 2]``. Gemma 4 has
no video tower: vLLM's processor cuts a video into its sampled frames, each an image at a
smaller token budget (``pixel_values_videos [frames, patches, 3 * P * P]``,
``pixel_position_ids_videos [frames, patches, 2]``), and writes each frame as its timestamp
text and its own run of video tokens between begin and end markers; the tower embeds each
frame, and a frame's tokens attend to each other as an image's do. A checkpoint with an
``audio_config`` (the E-series) takes audio too: each clip's log-mel frames
(``input_features_padded``, ``input_features_mask``) run through the audio tower (``audio``)
into its run of audio tokens, which stay causal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration as VllmGemma4
from vllm_tt_models_registry.contract import MM_POSITIONS_KWARG
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import CheckpointError, WeightFolder, check_shapes
from vllm_tt_host.models.frame.config import model_name
from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.inputs import PrefillRow
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import (
    computed_pixels,
    image_runs,
    live_images,
    per_row,
    text_and_vision,
)
from vllm_tt_host.models.frame.vllm_surface import vllm_multimodal_processing
from vllm_tt_host.models.gemma4.audio import (
    AUDIO_EMBEDDER_PREFIXES,
    AUDIO_PREFIXES,
    Gemma4AudioConfig,
    Gemma4AudioTower,
    load_audio_weights,
)
from vllm_tt_host.models.gemma4.embedder import (
    Gemma4UnifiedAudioEmbedder,
    Gemma4UnifiedEmbedder,
    UnifiedAudioConfig,
    UnifiedVisionConfig,
)
from vllm_tt_host.models.gemma4.model import (
    Gemma4Config,
    Gemma4Decoder,
    HostGemma4ForCausalLM,
    load_gemma4_weights,
)
from vllm_tt_host.models.gemma4.vision import Gemma4VisionConfig, Gemma4VisionTower, load_vision_weights

TEXT_PREFIXES: tuple[str, ...] = ("model.language_model.", "language_model.model.")
"""Where checkpoints keep the text decoder (transformers 5 writes the first)."""
VISION_PREFIXES: tuple[str, ...] = ("model.vision_tower.", "vision_tower.")
EMBEDDER_PREFIXES: tuple[str, ...] = ("model.embed_vision.", "embed_vision.")
PLACEHOLDER_IDS: tuple[str, ...] = ("image_token_id", "video_token_id", "audio_token_id")
"""The multimodal placeholder tokens transformers embeds as the pad token."""


@dataclass(frozen=True)
class Gemma4VLConfig(Gemma4Config):
    """The text decoder's numbers plus the vision tower's and the placeholder tokens'."""

    vision: Gemma4VisionConfig | UnifiedVisionConfig = field(kw_only=True)
    """The vision tower's (Gemma 4 Unified: the encoder-free embedder's)."""
    image_token_id: int = field(kw_only=True)
    placeholder_ids: tuple[int, ...] = field(kw_only=True)
    """Every placeholder token (image, video, audio) of the checkpoint..."""
    pad_token_id: int = field(kw_only=True)
    """...embedded as this one."""
    audio: Gemma4AudioConfig | UnifiedAudioConfig | None = field(default=None, kw_only=True)
    """The audio tower's (Unified: its audio embedder's), for a checkpoint with an ``audio_config``
    (the E-series)."""

    @classmethod
    def read(cls, hf_config: Any, family: str = "gemma4", *, n_layers: int | None = None) -> Gemma4VLConfig:
        """Read a ``Gemma4Config`` (``text_config`` + ``vision_config``, and ``audio_config``
        where the checkpoint has one)."""
        model = model_name(hf_config)
        text_config, vision_config = text_and_vision(
            hf_config, "serve a Gemma 4 vision-language checkpoint, or a text one as Gemma4ForCausalLM",
        )
        text = Gemma4Config.read(text_config, family, n_layers=n_layers)
        ids = {name: _token_id(hf_config, name, model) for name in PLACEHOLDER_IDS}
        pad = _token_id(text_config, "pad_token_id", model)
        if pad >= text.vocab_size:
            raise TTConfigError(f"{model}: text_config.pad_token_id", pad, f"below vocab_size={text.vocab_size}",
                                "check the checkpoint's config.json")
        fields = {f.name: getattr(text, f.name) for f in dataclasses.fields(text)}
        return cls(**fields, vision=cls.read_vision(vision_config), image_token_id=ids["image_token_id"],
                   placeholder_ids=tuple(ids.values()), pad_token_id=pad,
                   audio=cls.read_audio(getattr(hf_config, "audio_config", None)))

    @staticmethod
    def read_vision(hf_vision: Any) -> Gemma4VisionConfig | UnifiedVisionConfig:
        return Gemma4VisionConfig.from_hf(hf_vision)

    @staticmethod
    def read_audio(hf_audio: Any) -> Gemma4AudioConfig | UnifiedAudioConfig | None:
        return None if hf_audio is None else Gemma4AudioConfig.from_hf(hf_audio)


def _token_id(hf_config: Any, name: str, model: str) -> int:
    value = getattr(hf_config, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TTConfigError(f"{model}: {name}", value, "a token id", "check the checkpoint's config.json")
    return value


@dataclass(frozen=True)
class PatchedImage:
    """One image (or video frame) as the Gemma 4 processor cut it."""

    pixels: torch.Tensor
    """``[patches, 3 * P * P]``"""
    positions: torch.Tensor
    """``[patches, 2]``: each patch's ``(x, y)``; padding at ``(-1, -1)``."""
    video: bool = False
    """A video frame: its tokens are the video token's."""


@dataclass(frozen=True)
class AudioClip:
    """One audio clip as the Gemma 4 feature extractor made it."""

    features: torch.Tensor
    """``[frames, mels]``: log-mel frames."""
    mask: torch.Tensor
    """``[frames]``: True for a real frame."""


PromptItem = PatchedImage | tuple[PatchedImage, ...] | AudioClip | None
"""A prefill row's multimodal item: an image, a video's frames, an audio clip, or None (sent
without data: inside the prefix-cache hit)."""


def _kind(unit: PatchedImage | AudioClip) -> str:
    """What a placeholder run holds: ``image``, ``video`` (one frame) or ``audio``."""
    return "audio" if isinstance(unit, AudioClip) else "video" if unit.video else "image"


class Gemma4VLDecoder(Gemma4Decoder):
    config: Gemma4VLConfig

    def __init__(self, config: Gemma4VLConfig, weights: Any, tower: Gemma4VisionTower | Gemma4UnifiedEmbedder,
                 audio: Gemma4AudioTower | Gemma4UnifiedAudioEmbedder | None = None) -> None:
        super().__init__(config, weights)
        self.tower = tower
        self.audio = audio
        """The audio tower, for a checkpoint with an ``audio_config``."""
        self.placeholders = torch.tensor(config.placeholder_ids)
        self.kind_of = {token: name.removesuffix("_token_id")
                        for name, token in zip(PLACEHOLDER_IDS, config.placeholder_ids, strict=True)}
        """Placeholder token -> the kind of item its runs hold."""

    @classmethod
    def load(cls, folder: Path, config: Any) -> HostDecoder:
        """The text decoder, tower and embedder (``config``: a ``Gemma4VLConfig``), under the
        names transformers 5 (or 4) wrote."""
        reader = WeightFolder(folder)
        text = reader.prefix(TEXT_PREFIXES, "embed_tokens.weight", "text decoder")
        return cls(config, load_gemma4_weights(folder, config, text), cls.load_encoder(reader, config),
                   None if config.audio is None else cls.load_audio(reader, config))

    @staticmethod
    def load_encoder(reader: WeightFolder, config: Gemma4VLConfig) -> Gemma4VisionTower | Gemma4UnifiedEmbedder:
        """The image encoder: the vision tower and its embedder into the text width."""
        vision = cast(Gemma4VisionConfig, config.vision)  # what read_vision makes
        tower = reader.prefix(VISION_PREFIXES, "patch_embedder.input_proj.weight", "vision tower")
        embedder = reader.prefix(EMBEDDER_PREFIXES, "embedding_projection.weight", "vision embedder")
        weights = load_vision_weights(reader, tower, embedder, vision)
        expected = (config.hidden_size, vision.hidden_size)
        if tuple(weights.embedding.shape) != expected:
            raise CheckpointError(f"{embedder}embedding_projection.weight in {reader.folder} has shape "
                                  f"{tuple(weights.embedding.shape)}, config.json implies {expected}")
        return Gemma4VisionTower(vision, weights)

    @staticmethod
    def load_audio(reader: WeightFolder, config: Gemma4VLConfig) -> Gemma4AudioTower | Gemma4UnifiedAudioEmbedder:
        """The audio tower and its embedder (``config.audio`` is set)."""
        audio = cast(Gemma4AudioConfig, config.audio)  # what read_audio makes
        tower = reader.prefix(AUDIO_PREFIXES, "output_proj.weight", "audio tower")
        embedder = reader.prefix(AUDIO_EMBEDDER_PREFIXES, "embedding_projection.weight", "audio embedder")
        weights = load_audio_weights(reader, tower, embedder, audio)
        check_shapes({f"{embedder}embedding_projection.weight": (weights.embedding, (config.hidden_size,
                                                                                     audio.output_dims))},
                     reader.folder, implied_by="the text and audio configs")
        return Gemma4AudioTower(audio, weights)

    def _as_text(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` with every placeholder token replaced by the pad token."""
        return torch.where(torch.isin(ids, self.placeholders), self.config.pad_token_id, ids)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return super()._embed(self._as_text(ids))

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        return super()._per_layer_inputs(self._as_text(ids), x)

    def _image_blocks(self, index: int, inserts: PrefillInserts | None) -> torch.Tensor | None:
        both_ways = self.config.images_both_ways and self.config.window(index) is not None
        return super()._image_blocks(index, inserts) if both_ways else None

    def inserts(self, ids: torch.Tensor, start: int, items: list[PromptItem] | None, row: int,
                positions: list[tuple[int, int]] | None = None) -> PrefillInserts | None:
        """Row ``row``'s image and audio vectors for computing ``[start, len(ids))`` of its token
        history ``ids``; ``items`` in prompt order (None: none sent), ``positions`` their
        placeholder ranges (``MM_POSITIONS_KWARG``, when sent). Each image, video frame and audio
        clip is one placeholder run; only the runs the pass computes run their tower."""
        runs = self._runs(ids)
        if runs and runs[-1][1] == ids.shape[0]:
            raise HostModelInputError(
                f"prefill row {row}: the image placeholders from {runs[-1][0]} reach the chunk end {ids.shape[0]} "
                "without their end marker (the chunk end cuts an image: the runner must not split one across "
                "prefill chunks)"
            )
        kinds = [self.kind_of[int(ids[first])] for first, _ in runs]
        frames = _frames(items, positions, runs, kinds, start, row)
        live = live_images(runs, start, frames, row, "images, video frames and clips")
        if not live:
            return None
        blocks = torch.full((ids.shape[0],), -1, dtype=torch.long)
        index, vectors = [], []
        for k, unit in zip(live, computed_pixels(live, row, start), strict=True):
            first, stop = runs[k]
            if _kind(unit) != kinds[k]:
                raise HostModelInputError(f"prefill row {row}: placeholder run {k} at {first}..{stop} holds "
                                          f"{kinds[k]} tokens, the item sent for it is {_kind(unit)}")
            features = self._encode(unit, row)
            if features.shape[0] != stop - first:
                raise HostModelInputError(
                    f"prefill row {row}: {kinds[k]} item {k} makes {features.shape[0]} tokens, its placeholder run "
                    f"at {first}..{stop} holds {stop - first}"
                )
            if not isinstance(unit, AudioClip):  # a clip's tokens stay causal
                blocks[first:stop] = k
            lo = max(first, start)
            index.append(torch.arange(lo, stop) - start)
            vectors.append(features[lo - first :])
        return PrefillInserts(torch.cat(index), torch.cat(vectors), blocks)

    def _runs(self, ids: torch.Tensor) -> list[tuple[int, int]]:
        """The image, video-frame and audio placeholder runs of ``ids``, in order."""
        return sorted(run for token in self.kind_of for run in image_runs(ids, token))

    def _encode(self, unit: PatchedImage | AudioClip, row: int) -> torch.Tensor:
        """An image's or frame's tokens through the vision tower, a clip's through the audio one."""
        if not isinstance(unit, AudioClip):
            return self.tower(unit.pixels, unit.positions)
        if self.audio is None:
            raise HostModelInputError(f"prefill row {row}: an audio clip was sent, but the checkpoint has no "
                                      "audio_config (no audio tower)")
        return self.audio(unit.features, unit.mask)


def _frames(items: list[PromptItem] | None, positions: list[tuple[int, int]] | None, runs: list[tuple[int, int]],
            kinds: list[str], start: int, row: int) -> list[PatchedImage | AudioClip | None] | None:
    """``items`` as one entry per placeholder run (a video: one per frame). An item sent
    without data (inside the prefix-cache hit) has as many runs as start inside its placeholder
    range; without ``positions`` it counts as one, which is right for an image, and a pass that
    computes runs after a video it did not compute, with such an item among the sent, is
    refused rather than guessed."""
    computes = any(stop > start for _, stop in runs)
    if items is None or not computes:  # nothing to embed
        return None
    if positions is not None:
        if len(positions) != len(items):
            raise HostModelInputError(f"prefill row {row}: {len(positions)} placeholder ranges (mm_positions) for "
                                      f"{len(items)} items; the runner sends one per item")
        frames: list[PatchedImage | AudioClip | None] = []
        for item, (offset, length) in zip(items, positions, strict=True):
            if item is None:
                frames += [None] * sum(offset <= first < offset + length for first, _ in runs)
            else:
                frames += item if isinstance(item, tuple) else (item,)
        return frames
    video_before = any(kind == "video" and stop <= start for (_, stop), kind in zip(runs, kinds, strict=True))
    if None in items and video_before:
        raise HostModelInputError(
            f"prefill row {row}: a prefix-cache hit covers an item of a prompt with videos, and the pass computes "
            "an image or frame after it; how many frames the covered items have is not sent (send each item's "
            "placeholder range in mm_positions, as vllm-tt's runner does)"
        )
    return [frame for item in items for frame in (item if isinstance(item, tuple) else (item,))]


ITEM_KWARGS: tuple[str, ...] = ("pixel_values", "pixel_position_ids", "pixel_values_videos",
                                "pixel_position_ids_videos", "input_features_padded", "input_features_mask")
"""What vLLM's Gemma 4 processor sends per item, in pairs: an image's, a video's, a clip's."""


def row_items(kwargs: dict[str, Any], rows: int) -> list[list[PromptItem] | None]:
    """The runner's row-aligned ``ITEM_KWARGS``: per image ``pixel_values [patches, 3 * P * P]``
    and ``pixel_position_ids [patches, 2]`` (or with a leading 1), per video the same with a
    leading frame axis (``..._videos``), per clip ``input_features_padded [frames, mels]`` and
    ``input_features_mask [frames]`` -> per row, its items in prompt order (None: none sent), an
    item None where nothing is sent for it (inside the prefix-cache hit)."""
    columns = [per_row(kwargs.get(name), rows, name) for name in ITEM_KWARGS]
    out: list[list[PromptItem] | None] = []
    for row, entries in enumerate(zip(*columns, strict=True)):
        count = max(len(entry) if entry else 0 for entry in entries)
        if not count:
            out.append(None)
            continue
        entries = tuple(entry or [None] * count for entry in entries)
        if any(len(entry) != count for entry in entries):
            raise HostModelInputError(f"prefill row {row}: {', '.join(ITEM_KWARGS)} must list the same items, one "
                                      "per image, video or clip (Gemma 4's processor writes both of a pair)")
        items: list[PromptItem] = []
        for k, (p, q, v, w, a, m) in enumerate(zip(*entries, strict=True)):
            if a is not None:
                items.append(_clip(a, m, row, k))
            elif v is not None:
                frames, frame_xy = _patches(v, w, row, k, video=True)
                items.append(tuple(PatchedImage(f, g, video=True) for f, g in zip(frames, frame_xy, strict=True)))
            elif p is not None:
                p, q = _patches(p, q, row, k, video=False)
                items.append(PatchedImage(p, q))
            else:
                items.append(None)
        out.append(items)
    return out


def _clip(features: Any, mask: Any, row: int, k: int) -> AudioClip:
    """Item ``k``'s checked clip: ``[frames, mels]`` floats and a ``[frames]`` mask (all real
    when none is sent)."""
    x = torch.as_tensor(features)
    x = x[0] if x.dim() == 3 and x.shape[0] == 1 else x
    real = torch.ones(x.shape[:1], dtype=torch.bool) if mask is None else torch.as_tensor(mask).reshape(-1).bool()
    if x.dim() != 2 or real.shape != x.shape[:1]:
        raise HostModelInputError(f"prefill row {row} item {k}: input_features_padded {tuple(x.shape)} and "
                                  f"input_features_mask {tuple(real.shape)}; expected [frames, mels] and [frames]")
    return AudioClip(x, real)


def _patches(pixels: Any, positions: Any, row: int, k: int, *, video: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Item ``k``'s checked ``(pixels, positions)``: ``[patches, 3 * P * P]`` and
    ``[patches, 2]`` for an image, with a leading frame axis for a video."""
    names = ("pixel_values_videos", "pixel_position_ids_videos") if video else ("pixel_values", "pixel_position_ids")
    if positions is None:
        raise HostModelInputError(f"prefill row {row} item {k}: {names[1]} must come with {names[0]} "
                                  "(Gemma 4's processor writes both)")
    p, q = (torch.as_tensor(t) for t in (pixels, positions))
    if not video:
        p, q = (t[0] if t.dim() == 3 and t.shape[0] == 1 else t for t in (p, q))
    if p.dtype == torch.uint8:
        raise HostModelInputError(f"{names[0]} of row {row} are uint8; Gemma 4 takes the image "
                                  "processor's rescaled floats (serve with --mm-device-do-normalize false)")
    dims = 3 if video else 2
    if p.dim() != dims or q.shape != (*p.shape[:-1], 2):
        frames = "frames, " if video else ""
        raise HostModelInputError(
            f"prefill row {row} item {k}: {names[0]} {tuple(p.shape)} and {names[1]} {tuple(q.shape)}; "
            f"expected [{frames}patches, 3 * P * P] and [{frames}patches, 2]"
        )
    return p, q


@vllm_multimodal_processing(VllmGemma4)
class HostGemma4ForConditionalGeneration(HostGemma4ForCausalLM):
    """Gemma 4 with images, videos and audio: prefill rows carry ``pixel_values`` and
    ``pixel_position_ids`` (a video: ``pixel_values_videos`` and ``pixel_position_ids_videos``,
    frame by frame; a clip: ``input_features_padded`` and ``input_features_mask``); the rest is
    Gemma 4 text."""

    family = "gemma4"
    model_capabilities: ClassVar[dict[str, Any]] = {**HostGemma4ForCausalLM.model_capabilities,
                                                    "modalities": ("image", "video", "audio")}
    config_type = Gemma4VLConfig
    decoder_type = Gemma4VLDecoder
    decoder: Gemma4VLDecoder

    def prefill_inserts(self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any],
                        ) -> list[PrefillInserts | None]:
        items = row_items(kwargs, len(rows))
        positions = per_row(kwargs.get(MM_POSITIONS_KWARG), len(rows), MM_POSITIONS_KWARG)
        if self.synthetic is not None:
            return [None] * len(rows)
        return [self.decoder.inserts(tokens[i, : row.end].long(), row.start, items[i], i, positions[i])
                for i, row in enumerate(rows)]
