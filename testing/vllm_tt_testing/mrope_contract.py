"""The TT runner reduced to what the Qwen-VL host-model tests need: one request per slot, its
images as ``pixel_values`` + ``image_grid_thw`` through ``prefill_forward`` (uint8 patches, as
vLLM sends them by default), the returned mRoPE deltas back through ``decode_forward``, and
prompts of text runs with images between them."""

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
