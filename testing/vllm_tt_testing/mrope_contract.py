"""The TT runner reduced to what the Qwen-VL host-model tests need: one request per slot, its
images as ``pixel_values`` + ``image_grid_thw`` (and videos as ``pixel_values_videos`` +
``video_grid_thw``) through ``prefill_forward`` (uint8 patches, as vLLM sends them by default),
the returned mRoPE deltas back through ``decode_forward``, and prompts of text runs with images
(or a Qwen3-VL video's frame groups) between them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

BLOCK = 16
NUM_BLOCKS = 64
VIDEO, START, END, IMAGE = 296, 297, 298, 299
"""The special tokens of the tiny random Qwen-VL checkpoints (vocabulary of 300)."""
GRIDS = ((1, 8, 8), (1, 4, 6))
"""Their two image grids: 16 and 6 image tokens (in Qwen2.5-VL's tower 4 and 2 attention windows of 2x2 merge units)."""
PATCH_WIDTH = 96
"""Values per patch of the tiny towers: 3 channels x 2 frames x 4 x 4 pixels."""


def random_vl_checkpoint(model_class: Any, config: Any, folder: Path) -> Path:
    """A seeded random Qwen-VL ``model_class(config)`` saved into ``folder``, its matrices scaled
    up from the 0.02 init (x4 text side, x8 tower) and a learned position table at unit scale,
    so that a wrong position or feature moves the logits well past the tolerance."""
    torch.manual_seed(0)
    hf = model_class(config)
    with torch.no_grad():
        for name, weight in hf.named_parameters():
            if "pos_embed" in name:
                weight.normal_(0, 1.0)
            elif weight.dim() == 2:
                weight.mul_(4.0 if "language_model" in name else 8.0)
    hf.save_pretrained(folder)
    return folder


def random_vl_fixtures(hf_class: Any, host_class: Any, config: Callable[[], Any], name: str,
                       ) -> tuple[Callable[..., Path], Callable[..., Any], Callable[..., Any]]:
    """The module fixtures of a Qwen-VL host test, for ``checkpoint, hf, model = ...`` at module
    level: ``random_vl_checkpoint`` of ``hf_class(config())`` in a folder named ``name``,
    transformers' model of it (float32, eval) and ``host_class`` built from it on a 1x1 host
    mesh (4 rows of 512 positions)."""

    @pytest.fixture(scope="module", name="checkpoint")
    def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return random_vl_checkpoint(hf_class, config(), tmp_path_factory.mktemp(name))

    @pytest.fixture(scope="module", name="hf")
    def hf(checkpoint: Path) -> Any:
        return hf_class.from_pretrained(checkpoint, dtype=torch.float32).eval()

    @pytest.fixture(scope="module", name="model")
    def model(checkpoint: Path) -> Any:
        from transformers import AutoConfig
        from vllm_tt_host.device import HostMeshDevice
        from vllm_tt_platform.mesh.shape import MeshShape

        return host_class.initialize_vllm_model(AutoConfig.from_pretrained(checkpoint), HostMeshDevice(MeshShape(1, 1)),
                                                4, 512)

    return checkpoint, hf, model


def pixels_u8(seed: int, grid: tuple[int, int, int]) -> torch.Tensor:
    """Flattened patches ``[t*h*w, PATCH_WIDTH]`` of a seeded random image."""
    t, h, w = grid
    return torch.randint(0, 256, (t * h * w, PATCH_WIDTH), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


def vl_prompt(seed: int, lengths: list[int], grids: tuple[tuple[int, int, int], ...], start: int, image: int,
              end: int) -> list[int]:
    """Text runs of ``lengths`` with an image (``start``, its ``t*h*w/4`` ``image`` tokens,
    ``end``) between each two."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for k, n in enumerate(lengths):
        if k:
            t, h, w = grids[k - 1]
            ids += [start] + [image] * (t * h * w // 4) + [end]
        ids += torch.randint(3, 290, (n,), generator=gen).tolist()
    return ids


FRAME_GRID = (3, 4, 4)
"""A Qwen3-VL video of six 16x16 frames: three temporal patches, one frame group of 4 video
tokens each."""


def frame_groups(seed: int, grid: tuple[int, int, int], start: int, video: int, end: int) -> list[int]:
    """A Qwen3-VL video's placeholder tokens: per temporal patch its timestamp text (two seeded
    tokens standing for ``<t seconds>``), ``start``, its ``h*w/4`` ``video`` tokens, ``end``."""
    gen = torch.Generator().manual_seed(seed)
    t, h, w = grid
    ids: list[int] = []
    for _ in range(t):
        ids += torch.randint(3, 290, (2,), generator=gen).tolist() + [start] + [video] * (h * w // 4) + [end]
    return ids


Row = tuple[int, list[int], int, int, Sequence[int | None]]
"""``(slot, ids, start, end, image seeds)``; a None seed: an image inside the prefix-cache hit,
its grid sent without pixels."""


LayerSpecs = Callable[[Any], list[Any]]
"""``model -> per-layer KV specs`` for ``allocate_kv_cache_per_layer`` (a hybrid-KV text side),
``NUM_BLOCKS`` blocks of ``BLOCK`` tokens each."""


class MropeRunner:
    def __init__(self, model: Any, grids: tuple[tuple[int, int, int], ...], layer_specs: LayerSpecs | None = None,
                 ) -> None:
        cfg = model.config
        self.model = model
        self.grids = grids
        self.kv = (model.allocate_kv_cache_per_layer(layer_specs(model)) if layer_specs is not None else
                   model.allocate_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32,
                                           cfg.num_layers))
        self.table = torch.stack([torch.arange(1 + 8 * s, 9 + 8 * s) for s in range(model.max_batch_size)]).int()
        self.per_layer: list[torch.Tensor] | None = None
        """A hybrid text side's tables, as the runner sends them: a recurrent layer's row its
        request's one state block as both the step's read and write blocks."""
        if layer_specs is not None:
            states = torch.zeros_like(self.table)
            states[:, :2] = self.table[:, :1]
            self.per_layer = [states if isinstance(shape[0], tuple) else self.table
                              for shape, _dtype, _idx in layer_specs(model)]

    def _tables(self, rows: list[int] | None = None) -> dict[str, Any]:
        """``page_table`` (and ``page_tables_per_layer``) of ``rows`` (every slot when None)."""
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        tables: dict[str, Any] = {"page_table": pick(self.table)}
        if self.per_layer is not None:
            tables["page_tables_per_layer"] = [pick(t) for t in self.per_layer]
        return tables

    def prefill(self, rows: list[Row], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, V] of each row's last position, or [B, T, V] with ``return_all_logits``; deltas)."""
        tokens = torch.zeros(len(rows), max(len(r[1]) for r in rows), dtype=torch.int32)
        for i, (_, ids, *_) in enumerate(rows):
            tokens[i, : len(ids)] = torch.tensor(ids)
        pixels = [[None if s is None else pixels_u8(s, self.grids[k]) for k, s in enumerate(seeds)] or None
                  for *_, seeds in rows]
        grids = [[torch.tensor(self.grids[k]) for k in range(len(seeds))] or None for *_, seeds in rows]
        sent = any(p is not None for row in pixels for p in row or [])
        images = {"pixel_values": pixels} if sent else {}  # as the runner: no key no image of the call has
        out, deltas = self.model.prefill_forward(
            tokens=tokens, **self._tables([r[0] for r in rows]), kv_cache=self.kv,
            prompt_lens=[r[3] for r in rows], start_pos=[r[2] for r in rows], empty_slots=[r[0] for r in rows],
            image_grid_thw=grids, **images, **kwargs,
        )
        return (out if kwargs.get("return_all_logits") else out[:, -1]), deltas

    def prefill_items(self, slot: int, ids: list[int], start: int, items: dict[str, Any],
                      ) -> tuple[torch.Tensor, int]:
        """One row's pass over ``ids[start:]`` with the runner's item lists ``items`` (image and
        video keys, one row): the logits ``[len(ids) - start, V]`` of the positions it computes
        and its delta."""
        out, deltas = self.model.prefill_forward(
            tokens=torch.tensor([ids], dtype=torch.int32), **self._tables([slot]), kv_cache=self.kv,
            prompt_lens=[len(ids)], start_pos=[start], empty_slots=[slot], return_all_logits=True, **items)
        return out[0, : len(ids) - start], int(deltas[0])

    def decode(self, tokens: dict[int, tuple[int, int]], deltas: list[int]) -> torch.Tensor:
        rows = self.model.max_batch_size
        ids = torch.zeros(rows, 1, dtype=torch.int32)
        start = torch.full((rows,), -1, dtype=torch.int32)
        for slot, (token, pos) in tokens.items():
            ids[slot, 0], start[slot] = token, pos
        return self.model.decode_forward(tokens=ids, start_pos=start, **self._tables(), kv_cache=self.kv,
                                         rope_deltas_all_users=deltas)[:, -1]


class MropeCase:
    """One Qwen-VL family's host model and its HF oracle on the same tiny checkpoint, with the
    whole-model checks every Qwen-VL family must pass (``tol``: the largest logit difference)."""

    TEXT: ClassVar[tuple[int, list[int], list[int]]] = (4, [9], [])
    """``(prompt seed, text run lengths, image seeds)`` of a text-only prompt, as ``ONE``, ``TWO``."""
    ONE: ClassVar[tuple[int, list[int], list[int]]] = (5, [4, 6], [7])
    TWO: ClassVar[tuple[int, list[int], list[int]]] = (6, [3, 5, 4], [8, 9])

    def __init__(self, hf: Any, model: Any, grids: tuple[tuple[int, int, int], ...], tokens: tuple[int, int, int],
                 tol: float = 1e-4, layer_specs: LayerSpecs | None = None) -> None:
        self.hf, self.model, self.grids, self.tol, self.layer_specs = hf, model, grids, tol, layer_specs
        self.start, self.image, self.end = tokens

    def runner(self) -> MropeRunner:
        """A runner over fresh KV for this case's model."""
        return MropeRunner(self.model, self.grids, self.layer_specs)

    def prompt(self, seed: int, lengths: list[int]) -> list[int]:
        return vl_prompt(seed, lengths, self.grids, self.start, self.image, self.end)

    def hf_logits(self, ids: list[int], seeds: list[int]) -> torch.Tensor:
        """HF's logits ``[T, V]`` at every position (the images normalised with the default
        constants, as the host model does for a checkpoint saved without a processor)."""
        from vllm_tt_host.models.frame.vision import PixelNorm

        input_ids = torch.tensor([ids])
        kwargs = {}
        if seeds:
            pixels = [PixelNorm().apply(pixels_u8(s, self.grids[k]), 3)
                      for k, s in enumerate(seeds)]
            kwargs = {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.tensor(self.grids[: len(seeds)])}
        with torch.no_grad():
            return self.hf(input_ids=input_ids, mm_token_type_ids=(input_ids == self.image).int(), **kwargs).logits[0]

    def assert_close(self, got: torch.Tensor, expected: torch.Tensor, what: object) -> None:
        worst = float((got - expected).abs().max())
        assert worst < self.tol, (what, worst)

    def check_prefill_then_decode(self) -> list[int]:
        """Three rows prefilled together, then one decode step with the returned deltas (HF sees
        the token appended); returns the deltas."""
        runner = self.runner()
        rows = [(self.prompt(seed, lengths), seeds) for seed, lengths, seeds in (self.TEXT, self.ONE, self.TWO)]
        logits, deltas = runner.prefill([(slot, ids, 0, len(ids), seeds) for slot, (ids, seeds) in enumerate(rows)])
        refs = [self.hf_logits(ids, seeds) for ids, seeds in rows]
        for slot, (ours, ref) in enumerate(zip(logits, refs, strict=True)):
            self.assert_close(ours, ref[-1], ("prefill", slot))
        nxt = [int(r[-1].argmax()) for r in refs]
        step = runner.decode({slot: (nxt[slot], len(ids)) for slot, (ids, _) in enumerate(rows)},
                             deltas.tolist() + [0])
        for slot, (ids, seeds) in enumerate(rows):
            self.assert_close(step[slot], self.hf_logits(ids + [nxt[slot]], seeds)[-1], ("decode", slot))
        return deltas.tolist()

    def two_image_prompt(self) -> tuple[list[int], int]:
        """The two-image prompt and a position inside the text between its images."""
        seed, lengths, _ = self.TWO
        t, h, w = self.grids[0]
        return self.prompt(seed, lengths), lengths[0] + 1 + t * h * w // 4 + 1 + 2

    def check_chunk_after_image(self) -> int:
        """A chunk ending after the first image, then one computing the second; returns the delta."""
        runner = self.runner()
        ids, cut = self.two_image_prompt()
        seeds = self.TWO[2]
        first, _ = runner.prefill([(3, ids[:cut], 0, cut, seeds)])
        last, deltas = runner.prefill([(3, ids, cut, len(ids), seeds)])
        ref = self.hf_logits(ids, seeds)
        self.assert_close(first[0], ref[cut - 1], "first chunk")
        self.assert_close(last[0], ref[-1], "second chunk")
        return int(deltas[0])

    def check_prefix_hit_past_images(self) -> int:
        """vLLM keeps only ``image_grid_thw`` of an image inside the prefix-cache hit (no pixels):
        passes from inside the text between the images and from past both equal HF; returns the
        delta (the same for every pass)."""
        runner = self.runner()
        ids, past_first = self.two_image_prompt()
        seeds = self.TWO[2]
        ref = self.hf_logits(ids, seeds)[-1]
        runner.prefill([(3, ids, 0, len(ids), seeds)])
        delta = set()
        for start, sent in ((past_first, [None, seeds[1]]), (len(ids) - 2, [None, None])):
            got, deltas = runner.prefill([(3, ids, start, len(ids), sent)])
            self.assert_close(got[0], ref, ("prefix hit from", start))
            delta.add(int(deltas[0]))
        assert len(delta) == 1, delta
        return delta.pop()


class FrameGroupVideos:
    """The video checks of a Qwen3-VL-style family (Qwen3-VL, Qwen 3.5): a video of
    ``FRAME_GRID`` as its frame groups (timestamp text between them), alone and after an image,
    against transformers, whole and in chunks that end between two frame groups."""

    def __init__(self, case: MropeCase, video: int) -> None:
        self.case, self.video = case, video

    def prompt(self, with_image: bool) -> list[int]:
        """Text, [an image of ``GRIDS[0]``, text,] the video, text."""
        case = self.case
        head = case.prompt(12, [3, 4]) if with_image else case.prompt(12, [3])
        return head + frame_groups(13, FRAME_GRID, case.start, self.video, case.end) + case.prompt(14, [5])

    def items(self, with_image: bool) -> dict[str, list[list[Any] | None]]:
        """The runner's item lists for ``prompt``'s one row (prompt order; ``None`` at the other
        modality's place)."""
        video = {"pixel_values_videos": [pixels_u8(20, FRAME_GRID)], "video_grid_thw": [torch.tensor(FRAME_GRID)]}
        if not with_image:
            return {key: [value] for key, value in video.items()}
        return {"pixel_values": [[pixels_u8(21, self.case.grids[0]), None]],
                "image_grid_thw": [[torch.tensor(self.case.grids[0]), None]],
                **{key: [[None, *value]] for key, value in video.items()}}

    def hf_inputs(self, with_image: bool) -> dict[str, torch.Tensor]:
        from vllm_tt_host.models.frame.vision import PixelNorm

        case = self.case
        ids = torch.tensor([self.prompt(with_image)])
        types = torch.where(ids == self.video, 2, (ids == case.image).int())
        inputs = {"input_ids": ids, "mm_token_type_ids": types,
                  "pixel_values_videos": PixelNorm().apply(pixels_u8(20, FRAME_GRID), 3),
                  "video_grid_thw": torch.tensor([FRAME_GRID])}
        if with_image:
            inputs |= {"pixel_values": PixelNorm().apply(pixels_u8(21, case.grids[0]), 3),
                       "image_grid_thw": torch.tensor([case.grids[0]])}
        return inputs

    def hf_positions(self, with_image: bool) -> tuple[torch.Tensor, int]:
        """transformers' ``get_rope_index``: the ``[3, T]`` indices and the delta."""
        inputs = self.hf_inputs(with_image)
        positions, delta = self.case.hf.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs["video_grid_thw"])
        return positions[:, 0], int(delta)

    def check_positions(self, with_image: bool) -> list[int]:
        """The host's mRoPE indices and delta equal ``get_rope_index``'s; returns the lengths of
        the video's placeholder runs (one per frame group)."""
        from vllm_tt_host.models.qwen2_5_vl.media import Media, mrope_positions

        ids = self.prompt(with_image)
        media = [Media(self.case.grids[0], None)] * with_image + [Media(FRAME_GRID, None, 1.0)]
        ours, runs = mrope_positions(torch.tensor(ids), media, self.case.model.decoder.config)
        expected, delta = self.hf_positions(with_image)
        assert torch.equal(ours, expected), (ours, expected)
        assert int(ours.max()) + 1 - len(ids) == delta
        return [r.stop - r.first for r in runs if media[r.item].is_video]

    def check(self, with_image: bool) -> int:
        """Every position's logits equal HF's in one pass, and over two chunks: the first ends
        after the first frame group (inside the video), the second computes the rest (the
        tower again, its later frame groups used). Returns the delta, HF's."""
        case = self.case
        with torch.no_grad():
            expected = case.hf(**self.hf_inputs(with_image)).logits[0]
        ids = self.prompt(with_image)
        runner = case.runner()
        whole, delta = runner.prefill_items(0, ids, 0, self.items(with_image))
        case.assert_close(whole, expected, ("video, whole", with_image))
        first_video = ids.index(self.video)
        cut = ids.index(case.end, first_video) + 1
        runner = case.runner()
        head, _ = runner.prefill_items(1, ids[:cut], 0, self.items(with_image))
        tail, tail_delta = runner.prefill_items(1, ids, cut, self.items(with_image))
        case.assert_close(head, expected[:cut], ("video, first chunk", with_image))
        case.assert_close(tail, expected[cut:], ("video, second chunk", with_image))
        assert delta == tail_delta == self.hf_positions(with_image)[1], (delta, tail_delta)
        return delta


def frame_group_video_tests(video: int) -> tuple[Callable[..., None], Callable[..., None]]:
    """The video tests of a Qwen3-VL-style host module (over its ``case`` fixture), for
    ``test_positions, test_logits = frame_group_video_tests(VIDEO)`` at module level."""
    with_image = pytest.mark.parametrize("with_image", [False, True], ids=["one video", "image then video"])

    @with_image
    def positions(case: MropeCase, with_image: bool) -> None:
        """Each frame group is one placeholder run placed as a one-frame image; the timestamp
        text between them advances the positions (no temporal step of its own)."""
        assert FrameGroupVideos(case, video).check_positions(with_image) == [4] * FRAME_GRID[0]

    @with_image
    def logits(case: MropeCase, with_image: bool) -> None:
        """The tower runs over all the frames (attention within each temporal patch); the
        second chunk continues the text side's state (KV, delta-net states) across a cut inside
        the video."""
        assert FrameGroupVideos(case, video).check(with_image) != 0

    return positions, logits
