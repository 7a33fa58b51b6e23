"""The runner's image path: each prefill row's processed images (vLLM ``mm_features``) reach
``prefill_forward`` as the contract's row-aligned ``IMAGE_KWARGS``; an mRoPE model's deltas are
kept per request and sent slot-ordered with every decode. A recording contract model stands in
for the model; real vLLM scheduler-output and multimodal types drive the runner."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from vllm.config import VllmConfig
from vllm.config.multimodal import MultiModalConfig
from vllm.multimodal.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm_tt_models_registry import RegisteredModel
from vllm_tt_models_registry.contract import IMAGE_KWARGS, MM_POSITIONS_KWARG, ROPE_DELTAS_KWARG
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.config.startup_checks import restrict_modalities
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshRequest, MeshShape
from vllm_tt_platform.mesh.topology import Topology
from vllm_tt_platform.runner.mm_inputs import MultimodalInputError
from vllm_tt_platform.runner.model_runner import TTModelRunner
from vllm_tt_testing.kv_planning import plan_kv_cache
from vllm_tt_testing.scheduler_outputs import cached_requests, new_request, scheduler_output

IMAGE_TOKEN = 9


class ImageRecorder:
    """Records every forward's kwargs; answers token 1. As an mRoPE model its prefill returns
    ``(logits, deltas)`` with row ``i``'s delta ``-(10 * its images + prompt_len)``."""

    model_capabilities: ClassVar[dict[str, Any]] = {"single_program_lanes": True}
    mrope: ClassVar[bool] = False

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: Any, max_batch_size: int, max_seq_len: int,
                              tt_data_parallel: int = 1, optimizations: str | None = None) -> ImageRecorder:
        return cls(hf_config.vocab_size)

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any, num_layers: int) -> Any:
        return "kv"

    def called(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for member, kwargs in self.calls if member == name]

    def _logits(self, rows: int) -> torch.Tensor:
        logits = torch.zeros((rows, 1, self.vocab))
        logits[:, 0, 1] = 10.0
        return logits

    def prefill_forward(self, tokens: Any, page_table: Any, kv_cache: Any, prompt_lens: Any, start_pos: Any = None,
                        empty_slots: Any = None, sampling_params: Any = None, enable_trace: bool = False,
                        **kwargs: Any) -> Any:
        self.calls.append(("prefill_forward", {"prompt_lens": list(prompt_lens), **kwargs}))
        logits = self._logits(tokens.shape[0])
        if not self.mrope:
            return logits
        images = kwargs.get("pixel_values") or [None] * tokens.shape[0]
        deltas = torch.tensor([-(10 * len(img or ()) + int(n)) for img, n in zip(images, prompt_lens, strict=True)])
        return logits, deltas

    def decode_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, enable_trace: bool = False,
                       read_from_device: bool = True, sampling_params: Any = None, **kwargs: Any) -> Any:
        self.calls.append(("decode_forward", {"start_pos": start_pos.tolist(), **kwargs}))
        return self._logits(tokens.shape[0])


class MropeRecorder(ImageRecorder):
    mrope = True


@pytest.fixture(scope="module")
def vllm_config(tiny_checkpoint) -> VllmConfig:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(tiny_checkpoint("llama")), max_model_len=256, max_num_seqs=4,
        additional_config={"tt": {"mesh_backend": "host"}},
    ).create_engine_config()


def make_runner(vllm_config: VllmConfig, model_cls: type[ImageRecorder], *, lanes: int = 1,
                rows: int = 4) -> TTModelRunner:
    registered = RegisteredModel("TTFakeVLForConditionalGeneration",
                                 f"{model_cls.__module__}:{model_cls.__name__}", "test")
    setup = TTSetup(
        config=TTConfig.from_sources({"mesh_backend": "host", "trace_mode": "none",
                                      "enable_model_warmup": False}, environ={}),
        model=registered, capabilities=registered.capabilities(),
        topology=Topology(MeshRequest(MeshShape(1, lanes), "test"), lanes, rows),
    )
    runner = TTModelRunner(vllm_config, setup, object())
    runner.uses_mrope = model_cls.mrope  # what ModelConfig.uses_mrope says for a Qwen-VL config
    runner.load_model()
    runner.initialize_kv_cache(plan_kv_cache(vllm_config, runner.kv_cache_spec(), 10))
    return runner


def recorder(runner: TTModelRunner) -> ImageRecorder:
    model = runner.model
    assert isinstance(model, ImageRecorder)
    return model


def image(seed: int, offset: int, length: int = 4, modality: str = "image",
          keys: tuple[str, ...] = ("pixel_values", "image_grid_thw")) -> MultiModalFeatureSpec:
    """One processed image as vLLM's processor hands it over: its tensors and placeholder range."""
    values = {"pixel_values": torch.full((length * 4, 6), seed, dtype=torch.uint8),
              "image_grid_thw": torch.tensor([1, 2, 2 * length // 2]),
              "image_sizes": torch.tensor([seed, seed + 1])}
    item = MultiModalKwargsItem({k: MultiModalFieldElem(data=values[k], field=MultiModalBatchedField())
                                 for k in keys})
    return MultiModalFeatureSpec(data=item, modality=modality, identifier=f"img{seed}",
                                 mm_position=PlaceholderRange(offset=offset, length=length))


def vl_request(req_id: str, prompt: list[int], blocks: list[int], images: list[MultiModalFeatureSpec]) -> Any:
    req = new_request(req_id, prompt, blocks)
    req.mm_features = images
    return req


def run(runner: TTModelRunner, out: Any) -> None:
    assert runner.execute_model(out) is None
    runner.sample_tokens(None)


PROMPT_1 = [1, 2, *[IMAGE_TOKEN] * 4, 3]
PROMPT_2 = [1, *[IMAGE_TOKEN] * 4, 2, *[IMAGE_TOKEN] * 4, 3]


def test_prefill_rows_get_their_images_in_row_order_and_text_rows_none(vllm_config):
    runner = make_runner(vllm_config, ImageRecorder)
    one, two_a, two_b = image(1, 2), image(2, 1), image(3, 6)
    run(runner, scheduler_output(
        [new_request("text", [4, 5, 6], [1]), vl_request("one", PROMPT_1, [2], [one]),
         vl_request("two", PROMPT_2, [3], [two_a, two_b])],
        scheduled={"text": 3, "one": len(PROMPT_1), "two": len(PROMPT_2)},
    ))
    (call,) = recorder(runner).called("prefill_forward")
    assert set(call) & set(IMAGE_KWARGS) == {"pixel_values", "image_grid_thw"}, "the processor's keys, by name"
    pixels, grids = call["pixel_values"], call["image_grid_thw"]
    assert pixels[0] is None and grids[0] is None, "a text-only row gets None"
    assert [int(p[0, 0]) for p in pixels[1]] == [1]
    assert [int(p[0, 0]) for p in pixels[2]] == [2, 3], "one tensor per image, in prompt order"
    assert pixels[1][0].dtype == torch.uint8, "passed through as the processor produced it"
    assert [g.tolist() for g in grids[2]] == [[1, 2, 4], [1, 2, 4]]
    assert call[MM_POSITIONS_KWARG] == [None, [(2, 4)], [(1, 4), (6, 4)]], "each item's placeholder range"
    run(runner, scheduler_output(cached=cached_requests(["text", "one", "two"], [3, 7, 11]),
                                 scheduled={"text": 1, "one": 1, "two": 1}))
    (decode,) = recorder(runner).called("decode_forward")
    assert not set(decode) & set(IMAGE_KWARGS), "decode steps carry no images"
    assert ROPE_DELTAS_KWARG not in decode, "not an mRoPE model"


def test_a_text_only_step_sends_no_image_kwargs_and_keys_pass_through_by_name(vllm_config):
    runner = make_runner(vllm_config, ImageRecorder)
    run(runner, scheduler_output([new_request("text", [4, 5, 6], [1])], scheduled={"text": 3}))
    sized = image(5, 2, keys=("pixel_values", "image_sizes"))  # Gemma 3 / Mistral 3 style
    run(runner, scheduler_output([vl_request("g", PROMPT_1, [2], [sized])], scheduled={"g": len(PROMPT_1)}))
    text, gemma = recorder(runner).called("prefill_forward")
    assert not set(text) & {*IMAGE_KWARGS, MM_POSITIONS_KWARG}
    assert "image_grid_thw" not in gemma and [s.tolist() for s in gemma["image_sizes"][0]] == [[5, 6]]


def test_every_prefill_chunk_of_a_row_carries_all_its_images(vllm_config):
    runner = make_runner(vllm_config, ImageRecorder)
    run(runner, scheduler_output([vl_request("two", PROMPT_2, [3], [image(2, 1), image(3, 6)])],
                                 scheduled={"two": 5}))
    run(runner, scheduler_output(cached=cached_requests(["two"], [5]), scheduled={"two": len(PROMPT_2) - 5}))
    first, second = recorder(runner).called("prefill_forward")
    assert len(first["pixel_values"][0]) == len(second["pixel_values"][0]) == 2, (
        "a later chunk's positions depend on the images before it"
    )


def test_an_image_inside_the_prefix_cache_hit_comes_without_data_and_is_sent_as_none(vllm_config):
    """vLLM strips the data of an image whose tokens the prefix-cache hit covers
    (strip_covered_mm_data); the row still gets one entry per image, None for that one. An
    image the pass computes without data stays an error. Its placeholder range is still sent
    (``MM_POSITIONS_KWARG``): a model counts the covered item's placeholder runs by it."""
    runner = make_runner(vllm_config, ImageRecorder)
    covered = dataclasses.replace(image(2, 1), data=None)
    request = vl_request("two", PROMPT_2, [3], [covered, image(3, 6)])
    request.num_computed_tokens = 5
    run(runner, scheduler_output([request], scheduled={"two": len(PROMPT_2) - 5}))
    (call,) = recorder(runner).called("prefill_forward")
    assert call["pixel_values"][0][0] is None and int(call["pixel_values"][0][1][0, 0]) == 3
    assert call["image_grid_thw"][0][0] is None
    assert call[MM_POSITIONS_KWARG] == [[(1, 4), (6, 4)]], "the covered image's range is sent, its data is not"
    late = vl_request("late", PROMPT_2, [4], [image(2, 1), dataclasses.replace(image(3, 6), data=None)])
    late.num_computed_tokens = 5
    with pytest.raises(MultimodalInputError, match="'late' image 1 reached the runner without its processed data"):
        runner.execute_model(scheduler_output([late], scheduled={"late": len(PROMPT_2) - 5}))


def test_mrope_deltas_are_kept_per_request_and_sent_by_slot_on_decode(vllm_config):
    runner = make_runner(vllm_config, MropeRecorder)
    run(runner, scheduler_output(
        [new_request("text", [4, 5, 6], [1]), vl_request("two", PROMPT_2, [3], [image(2, 1), image(3, 6)])],
        scheduled={"text": 3, "two": len(PROMPT_2)},
    ))
    run(runner, scheduler_output(cached=cached_requests(["two", "text"], [11, 3]), scheduled={"two": 1, "text": 1}))
    (decode,) = recorder(runner).called("decode_forward")
    assert decode[ROPE_DELTAS_KWARG] == [-3, -31, 0, 0], "slot order, padded to the decode batch"


def test_mrope_delta_survives_preemption_and_comes_back_from_the_re_prefill(vllm_config):
    runner = make_runner(vllm_config, MropeRecorder)
    run(runner, scheduler_output([vl_request("one", PROMPT_1, [2], [image(1, 2)])], scheduled={"one": 7}))
    run(runner, scheduler_output([new_request("text", [4, 5], [1])], scheduled={"text": 2}, preempted={"one"}))
    assert runner.batch.requests["text"].slot == 0, "the preempted request gave its slot back"
    resumed = cached_requests(["one"], [0], new_blocks=[([4],)], resumed={"one"},
                              all_tokens={"one": [*PROMPT_1, 1]})
    run(runner, scheduler_output(cached=resumed, scheduled={"one": 8}))
    resume = recorder(runner).called("prefill_forward")[-1]
    assert len(resume["pixel_values"][0]) == 1, "the resumed prefill gets its image again"
    run(runner, scheduler_output(cached=cached_requests(["text", "one"], [2, 8]), scheduled={"text": 1, "one": 1}))
    (decode,) = recorder(runner).called("decode_forward")
    assert decode[ROPE_DELTAS_KWARG] == [-2, -18, 0, 0]
    assert decode["start_pos"][:2] == [2, 8]


def test_lanes_send_every_lanes_deltas_in_global_slot_order(vllm_config):
    runner = make_runner(vllm_config, MropeRecorder, lanes=2, rows=2)
    run(runner, scheduler_output(
        [vl_request("one", PROMPT_1, [1], [image(1, 2)]), new_request("text", [4, 5, 6], [10 + 2])],
        scheduled={"one": 7, "text": 3},
    ))
    assert runner.batch.requests["text"].slot == 2, "the second lane's first slot"
    run(runner, scheduler_output(cached=cached_requests(["one", "text"], [7, 3]), scheduled={"one": 1, "text": 1}))
    (decode,) = recorder(runner).called("decode_forward")
    assert decode[ROPE_DELTAS_KWARG] == [-17, 0, -3, 0]


def test_an_item_of_another_modality_reaching_the_runner_names_the_request(vllm_config):
    """Gathering the inputs is host work: its error is raised as itself, never as a
    TTDeviceError (which tells the operator the device state is lost), and no device call ran."""
    runner = make_runner(vllm_config, ImageRecorder)
    with pytest.raises(MultimodalInputError) as raised:
        runner.execute_model(scheduler_output([vl_request("clip", PROMPT_1, [2], [image(1, 2, modality="speech")])],
                                              scheduled={"clip": 7}))
    assert "'clip' item 0 is 'speech'" in str(raised.value) and "image, video, audio only" in str(raised.value)
    assert not recorder(runner).called("prefill_forward")


def mm_config_of(**mm: Any) -> Any:
    return SimpleNamespace(model_config=SimpleNamespace(multimodal_config=MultiModalConfig(**mm)),
                           scheduler_config=SimpleNamespace(disable_chunked_mm_input=False))


def test_startup_limits_video_and_audio_to_zero_and_keeps_images_whole():
    config = mm_config_of(limit_per_prompt={"image": 2})
    restrict_modalities(config, "TTGemma3ForConditionalGeneration", ("image",))
    mm = config.model_config.multimodal_config
    assert [mm.get_limit_per_prompt(m) for m in ("image", "video", "audio")] == [2, 0, 0]
    assert config.scheduler_config.disable_chunked_mm_input is True
    restrict_modalities(config, "TTGemma3ForConditionalGeneration", ("image",))  # every process configures
    assert mm.get_limit_per_prompt("video") == 0


def test_startup_keeps_the_video_limit_of_a_model_that_takes_video():
    config = mm_config_of(limit_per_prompt={"image": 2, "video": 1})
    restrict_modalities(config, "TTQwen2_5_VLForConditionalGeneration", ("image", "video"))
    mm = config.model_config.multimodal_config
    assert [mm.get_limit_per_prompt(m) for m in ("image", "video", "audio")] == [2, 1, 0]


def test_startup_lets_vllm_split_items_over_chunks_for_a_model_declaring_chunked_mm_input():
    config = mm_config_of(limit_per_prompt={"image": 2, "video": 1})
    config.scheduler_config.disable_chunked_mm_input = True
    restrict_modalities(config, "TTQwen3_5ForConditionalGeneration", ("image", "video"), chunked_items=True)
    assert config.scheduler_config.disable_chunked_mm_input is False


def test_startup_keeps_the_audio_limit_of_a_model_that_takes_audio():
    config = mm_config_of(limit_per_prompt={"image": 1, "audio": 2, "video": 0})
    restrict_modalities(config, "TTGemma4ForConditionalGeneration", ("image", "video", "audio"))
    mm = config.model_config.multimodal_config
    assert [mm.get_limit_per_prompt(m) for m in ("image", "video", "audio")] == [1, 0, 2]


def test_startup_refuses_a_limit_asking_for_video_of_an_image_model():
    with pytest.raises(TTUnsupportedFeatureError,
                       match=r"--limit-mm-per-prompt=\{'video': 1\}.*TTGemma3ForConditionalGeneration takes image only"):
        restrict_modalities(mm_config_of(limit_per_prompt={"image": 1, "video": 1}),
                            "TTGemma3ForConditionalGeneration", ("image",))


def test_startup_refuses_multimodal_embeddings():
    with pytest.raises(TTUnsupportedFeatureError, match="--enable-mm-embeds"):
        restrict_modalities(mm_config_of(enable_mm_embeds=True), "TTGemma3ForConditionalGeneration", ("image",))
