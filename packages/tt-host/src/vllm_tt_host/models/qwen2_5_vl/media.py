"""A Qwen-VL prefill row's images and videos, their placeholder runs and mRoPE indices.

A row's items arrive as the runner sends them (``contract.IMAGE_KWARGS`` and ``VIDEO_KWARGS``:
one list per row, prompt order, ``None`` at the places of the other modality). An image fills
one run of ``image_token_id``. A Qwen2.5-VL video fills one run of ``video_token_id``, its
temporal index stepping by ``tokens_per_second * second_per_grid_ts`` (rounded down), so the
indices follow the video's clock. A Qwen3-VL (and Qwen 3.5) video fills one run per temporal
patch (``video_frame_runs``), each placed as a one-frame image: the processor writes the frame
group's timestamp as text before it, and that text advancing the positions is the video's clock.
Every run's tokens take their grid coordinates as mRoPE indices, offset by where the run
starts; the text after a run continues from its start plus its larger spatial side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import image_runs, per_row

Grid = tuple[int, int, int]


class MediaConfig(Protocol):
    """What the positions read from a Qwen-VL config (read-only: the configs are frozen)."""

    @property
    def image_token_id(self) -> int: ...

    @property
    def video_token_id(self) -> int: ...

    @property
    def tokens_per_second(self) -> float: ...

    @property
    def merge_size(self) -> int: ...

    @property
    def video_frame_runs(self) -> bool: ...


@dataclass(frozen=True)
class Media:
    """One image or video of a prefill row."""

    grid: Grid
    """``(t, h, w)`` in patches."""
    pixels: torch.Tensor | None
    """None: an item inside the prefix-cache hit (vLLM keeps only its CPU-side keys)."""
    seconds_per_grid: float | None = None
    """A video's seconds per temporal patch (``second_per_grid_ts``); None for an image."""

    @property
    def is_video(self) -> bool:
        return self.seconds_per_grid is not None


@dataclass(frozen=True)
class Run:
    """One placeholder run of an item: ``[first, stop)`` of the tokens, the item it belongs to
    and where its tokens start among the item's features."""

    first: int
    stop: int
    item: int
    offset: int


def row_media(kwargs: dict[str, Any], rows: int) -> list[list[Media]]:
    """Each prefill row's items, in prompt order, from the call's image and video arguments."""
    lists = {key: per_row(kwargs.get(key), rows, key)
             for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                         "second_per_grid_ts")}
    out = []
    for row in range(rows):
        items = {key: list(values[row] or []) for key, values in lists.items()}
        count = max(len(items["image_grid_thw"]), len(items["video_grid_thw"]))
        media = []
        for k in range(count):
            video_grid, image_grid = _at(items["video_grid_thw"], k), _at(items["image_grid_thw"], k)
            if video_grid is not None:
                seconds = _at(items["second_per_grid_ts"], k)
                media.append(Media(_grid(video_grid, row), _tensor(_at(items["pixel_values_videos"], k)),
                                   1.0 if seconds is None else float(torch.as_tensor(seconds).reshape(-1)[0])))
            elif image_grid is not None:
                media.append(Media(_grid(image_grid, row), _tensor(_at(items["pixel_values"], k))))
            else:
                raise HostModelInputError(f"row {row} item {k}: neither image_grid_thw nor video_grid_thw was sent")
        out.append(media)
    return out


def _at(values: list[Any], k: int) -> Any:
    return values[k] if k < len(values) else None


def _tensor(value: Any) -> torch.Tensor | None:
    return None if value is None else torch.as_tensor(value)


def _grid(value: Any, row: int) -> Grid:
    thw = [int(v) for v in torch.as_tensor(value).reshape(-1).tolist()]
    if len(thw) != 3:
        raise HostModelInputError(f"row {row}: a grid_thw entry is (t, h, w), got {thw}")
    return thw[0], thw[1], thw[2]


def item_runs(item: Media, config: MediaConfig) -> list[tuple[Grid, float]]:
    """The placeholder runs one item fills, in order: each run's grid and temporal step."""
    if not item.is_video:
        return [(item.grid, 1.0)]
    if config.video_frame_runs:
        t, h, w = item.grid
        return [((1, h, w), 0.0)] * t
    return [(item.grid, config.tokens_per_second * float(item.seconds_per_grid or 1.0))]


def mrope_positions(ids: torch.Tensor, media: list[Media], config: MediaConfig) -> tuple[torch.Tensor, list[Run]]:
    """The ``[3, len(ids)]`` mRoPE indices of a row's tokens and its placeholder runs, prompt
    order; the tokens may end before the last items or inside a run (a chunk: the run is cut
    where the tokens end, its indices as the whole run's)."""
    merge = config.merge_size
    found = sorted([(first, stop, False) for first, stop in image_runs(ids, config.image_token_id)]
                   + [(first, stop, True) for first, stop in image_runs(ids, config.video_token_id)])
    expected = [(k, item.is_video, grid, step, offset) for k, item in enumerate(media)
                for grid, step, offset in _with_offsets(item_runs(item, config), merge)]
    if len(found) > len(expected):
        raise HostModelInputError(
            f"the tokens hold {len(found)} image/video placeholder runs, the {len(media)} items sent fill {len(expected)}"
        )
    parts, runs, cursor, next_index = [], [], 0, 0
    for (first, stop, is_video), (k, want_video, (t, h, w), step, offset) in zip(found, expected, strict=False):
        kind, tokens = "video" if want_video else "image", t * h * w // merge**2
        cut = stop == ids.shape[0] and stop - first < tokens
        if is_video != want_video or (stop - first != tokens and not cut):
            raise HostModelInputError(
                f"a placeholder run at {first}..{stop} has {stop - first} {'video' if is_video else 'image'} "
                f"tokens, item {k} ({kind}, grid {(t, h, w)}) gives {tokens} {kind} tokens there"
            )
        parts.append(torch.arange(first - cursor).expand(3, -1) + next_index)
        next_index += first - cursor
        temporal = (torch.arange(t) * step).long()
        tt, hh, ww = torch.meshgrid(temporal, torch.arange(h // merge), torch.arange(w // merge), indexing="ij")
        parts.append(torch.stack((tt, hh, ww)).reshape(3, -1)[:, : stop - first] + next_index)
        next_index += max(h, w) // merge
        runs.append(Run(first, stop, k, offset))
        cursor = stop
    parts.append(torch.arange(ids.shape[0] - cursor).expand(3, -1) + next_index)
    return torch.cat(parts, dim=1), runs


def _with_offsets(runs: list[tuple[Grid, float]], merge: int) -> list[tuple[Grid, float, int]]:
    out, offset = [], 0
    for grid, step in runs:
        out.append((grid, step, offset))
        offset += grid[0] * grid[1] * grid[2] // merge**2
    return out
