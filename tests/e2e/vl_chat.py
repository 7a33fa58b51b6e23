"""Vision-language requests for the end-to-end tests: synthetic images of the tiny recipes
(``vllm_tt_testing.tiny_vl``), the chat prompt, OpenAI chat bodies with base64 ``image_url``
data URLs (and mp4 ``video_url`` ones, WAV ``input_audio`` ones), transformers' greedy answer
for the same prompt and images (or the frames vLLM decodes from the video), and ``vllm serve``
in lane mode with the check that images reached every lane."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from vllm_tt_testing.tiny_vl import QUESTION, synthetic_image, user_message

REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (2, 3), (3,), (1, 0), ()]
"""Image kinds per request; two of one kind use different seeds (different pixels)."""


WAV = base64.b64encode(b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00@\x1f\x00\x00\x80>\x00\x00"
                       b"\x02\x00\x10\x00data\x00\x00\x00\x00").decode()
BAD_REQUESTS: dict[str, list[dict[str, Any]]] = {
    "video": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAAIGZ0eXBpc29t"}}],
    "audio": [{"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}],
    "three images": [],  # the tests fill in three image parts
    "corrupt image": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdlIGF0IGFsbA=="}}],
}
"""What the front end refuses with a 400 (the model is never asked): a modality the TT models
are not sent, more images than ``--limit-mm-per-prompt`` allows (``image_parts`` fills the
empty entry), bytes that are not an image."""
VIDEO_BAD_REQUESTS: dict[str, list[dict[str, Any]]] = {
    **{name: parts for name, parts in BAD_REQUESTS.items() if name != "video"},
    "two videos": BAD_REQUESTS["video"] * 2,
    "corrupt video": BAD_REQUESTS["video"],
}
"""What the front end refuses from a model that takes videos, served with ``VIDEO_LIMITS``: a
modality it is not sent (audio), more images or videos than the limits allow, bytes that are
not an image or not a video."""
VIDEO_LIMITS = '{"image": 2, "video": {"count": 1, "num_frames": 4, "width": 32, "height": 32}}'
"""``--limit-mm-per-prompt`` of the serve tests of a model that takes videos."""


def images(kinds: tuple[int, ...], salt: int = 0, size: tuple[int, int] = (32, 32)) -> list[Any]:
    """PIL images (``size``: height, width) of these kinds; two of one kind (or another ``salt``)
    differ in their pixels."""
    from PIL import Image

    return [Image.fromarray(synthetic_image(k, 100 * salt + 10 * i + k, size)) for i, k in enumerate(kinds)]


def load_hf(checkpoint: Path) -> tuple[Any, Any]:
    """transformers' (model in float32, eval mode; processor) for a tiny checkpoint: the oracle."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(checkpoint)


def chat_text(processor: Any, count: int, question: str = QUESTION) -> str:
    return processor.apply_chat_template(user_message(count, question), add_generation_prompt=True, tokenize=False)


def hf_generate(hf_vl: tuple[Any, Any], kinds: tuple[int, ...], max_tokens: int, salt: int = 0, *,
                nested: bool = False, add_special_tokens: bool = True, question: str = QUESTION,
                size: tuple[int, int] = (32, 32),
                processor_kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[int]]:
    """HF's (prompt ids, greedy new tokens) for the chat prompt with these images. ``nested``:
    the processor takes one list of images per prompt (Gemma 3); ``add_special_tokens`` off
    tokenizes as a chat endpoint does (the rendered template already holds bos);
    ``processor_kwargs``: what the request passes as vLLM's ``mm_processor_kwargs``."""

    model, processor = hf_vl
    pictures = images(kinds, salt, size)
    inputs = processor(text=[chat_text(processor, len(kinds), question)],
                       images=([pictures] if nested else pictures) if pictures else None,
                       return_tensors="pt", add_special_tokens=add_special_tokens, **(processor_kwargs or {}))
    return greedy_of(model, inputs, max_tokens)


def greedy_of(model: Any, inputs: Any, max_tokens: int) -> tuple[list[int], list[int]]:
    """transformers' (prompt ids, greedy new tokens) of ``generate()`` on the processor's ``inputs``."""
    import torch

    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt):].tolist()


def item_prompt(text: str, data: dict[str, Any]) -> dict[str, Any]:
    """A ``vllm.LLM`` prompt: ``text`` with its ``multi_modal_data`` (none when ``data`` is empty)."""
    return {"prompt": text, **({"multi_modal_data": data} if data else {})}


def image_runs(ids: list[int], image_token: int) -> list[tuple[int, int]]:
    """``[first, stop)`` of each run of image placeholder tokens."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(ids):
        if token == image_token:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    return runs


def _is_request(rid: str, request_id: str) -> bool:
    """Whether the scheduler's ``rid`` is ``request_id`` (vLLM appends a suffix to it)."""
    return rid == request_id or rid.startswith(request_id + "-")


def chunk_ends(trace: list[dict[str, Any]], request_id: str, prompt_len: int) -> list[int]:
    """Where each prefill pass of ``request_id`` ended, read from the scheduler's step trace (or
    the lane coordinator's: each lane's part reads alike); a preemption before the prompt was
    done starts the count again (vLLM prefills it anew)."""
    ends, done = [], 0
    for part in (part for step in trace for part in step.get("lanes", [step])):
        if done < prompt_len and any(_is_request(rid, request_id) for rid in part.get("preempted", ())):
            done = 0
        for rid, tokens in part["scheduled"].items():
            if _is_request(rid, request_id) and done < prompt_len:
                done += tokens
                ends.append(done)
    return ends


def item_passes(trace_path: Path, results: Any, image_token: int, *, one_item: bool = False,
                ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Per prompt of ``results`` (``vllm.LLM`` outputs): where its prefill passes ended (the
    scheduler's step trace; the last at the prompt's end) and its runs of ``image_token``
    (``one_item``: the runs are one item's, a Qwen3-VL video's frame groups, taken as one)."""
    trace = [json.loads(line) for line in trace_path.read_text().splitlines()]
    out = []
    for result in results:
        ids = list(result.prompt_token_ids)
        runs = image_runs(ids, image_token)
        if one_item and runs:
            runs = [(runs[0][0], runs[-1][1])]
        ends = chunk_ends(trace, result.request_id, len(ids))
        assert ends and ends[-1] == len(ids), ends
        out.append((ends, runs))
    return out


def cuts(ends: list[int], runs: list[tuple[int, int]]) -> list[int]:
    """The pass ends that fall inside a run."""
    return [e for e in ends for first, stop in runs if first < e < stop]


def assert_chunks_keep_images(trace_path: Path, results: Any, image_token: int, *, one_item: bool = False) -> int:
    """Every prompt of ``results`` was prefilled in chunks that end outside its images
    (``item_passes``); returns how many prompts took more than one chunk."""
    passes = item_passes(trace_path, results, image_token, one_item=one_item)
    for ends, runs in passes:
        assert not cuts(ends, runs), (ends, runs)
    return sum(len(ends) > 1 for ends, _ in passes)


def preempted_at(trace_path: Path, request_id: str) -> list[int]:
    """How many tokens ``request_id`` had been scheduled (prompt and generated) each time vLLM
    preempted it, read from the scheduler's step trace; empty when it never was."""
    at, done = [], 0
    for line in trace_path.read_text().splitlines():
        step = json.loads(line)
        if any(_is_request(rid, request_id) for rid in step.get("preempted", ())):
            at.append(done)
            done = 0
        done += sum(tokens for rid, tokens in step["scheduled"].items() if _is_request(rid, request_id))
    return at


def preempted_while_decoding(trace_path: Path, results: Any) -> list[str]:
    """The request ids of ``results`` (``vllm.LLM`` outputs) that vLLM preempted after their
    prompt was done (it then prefills prompt and answer again)."""
    return [r.request_id for r in results
            if any(at > len(r.prompt_token_ids) for at in preempted_at(trace_path, r.request_id))]


def traced_llm(trace_path: Path, **engine_args: Any) -> Any:
    """``vllm.LLM(**engine_args)`` on the host backend (seed 0, stats on), its engine core
    in-process (to read its metrics) and its scheduler step trace written to ``trace_path``."""
    import pytest

    from tests.e2e.helpers import offline_llm

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_STEP_TRACE", str(trace_path))
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return offline_llm(seed=0, disable_log_stats=False, additional_config={"tt": {"mesh_backend": "host"}},
                           **engine_args)


def llm_prompts(processor: Any, requests: list[tuple[int, ...]], salt: int,
                size: tuple[int, int] = (32, 32)) -> list[dict[str, Any]]:
    """``vllm.LLM`` prompts: the chat text with these images (request ``i`` salted ``salt + i``)."""
    return [{"prompt": chat_text(processor, len(kinds)),
             **({"multi_modal_data": {"image": images(kinds, salt + i, size)}} if kinds else {})}
            for i, kinds in enumerate(requests)]


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(model: str, parts: list[dict[str, Any]], max_tokens: int, question: str = QUESTION) -> dict[str, Any]:
    """A greedy chat request (image parts, then the question) that returns its token ids."""
    return {"model": model, "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}],
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def post_chat(url: str, model: str, parts: list[dict[str, Any]], max_tokens: int, question: str = QUESTION) -> Any:
    """POST ``chat_body`` to the server at ``url``; the ``httpx`` response."""
    import httpx

    return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, max_tokens, question), timeout=300)


def image_parts(kinds: tuple[int, ...], salt: int, size: tuple[int, int] = (32, 32)) -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images(kinds, salt, size)]


VIDEO_FRAMES, VIDEO_FPS = 4, 2.0
"""The test videos: four frames at 2 fps, two temporal patches of one second each."""


def video_frames(salt: int, count: int = VIDEO_FRAMES, size: tuple[int, int] = (32, 32)) -> Any:
    """``[count, height, width, 3]`` uint8: frames of one synthetic kind (``salt % 4``), each its own pixels."""
    import numpy as np

    return np.stack([synthetic_image(salt % 4, 10 * salt + i, size) for i in range(count)])


def mp4(frames: Any, fps: float = VIDEO_FPS) -> bytes:
    """The bytes of an mp4 file of these RGB frames (OpenCV's ``mp4v`` codec: lossy, so the
    frames decoded from it are not the ones written)."""
    import tempfile

    import cv2

    height, width = frames.shape[1:3]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "video.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        if not writer.isOpened():
            raise RuntimeError("OpenCV cannot write an mp4v video here")
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        return path.read_bytes()


def video_part(data: bytes) -> dict[str, Any]:
    """An OpenAI ``video_url`` content part carrying these mp4 bytes as a base64 data URL."""
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}}


def served_video(checkpoint: Path, part: dict[str, Any],
                 media_io_kwargs: dict[str, dict[str, Any]] | None = None) -> tuple[Any, dict[str, Any]]:
    """The (frames, metadata) ``vllm serve`` decodes from a ``video_url`` part: vLLM's media
    connector with the server's ``--media-io-kwargs`` and the video loader vLLM picks for the
    checkpoint's video processor (Qwen2-VL's and Qwen3-VL's sample at 2 fps as transformers'
    processors do, whatever ``num_frames`` says; Gemma 4's has none of its own, so vLLM's
    default ``opencv`` loader keeps every frame up to ``num_frames``, 32 unless set)."""
    from vllm.multimodal.media import MediaConnector
    from vllm.transformers_utils.processor import get_video_processor_cls_name_from_config

    processor = get_video_processor_cls_name_from_config(str(checkpoint))
    connector = MediaConnector(media_io_kwargs=media_io_kwargs)
    return connector.fetch_video(part["video_url"]["url"], video_processor=processor).media


def hf_generate_video(hf_vl: tuple[Any, Any], video: tuple[Any, dict[str, Any]], max_tokens: int,
                      question: str = QUESTION) -> tuple[list[int], list[int]]:
    """HF's (prompt ids, greedy new tokens) for a chat of one video (frames and vLLM's metadata
    of them, as ``served_video`` returns) and the question, tokenized as a chat endpoint does
    (no bos added). Its processor samples frames as its defaults say; vLLM's keeps the same
    frames when the loader kept every frame (Qwen3-VL's then samples again, Qwen2.5-VL's not)."""
    from transformers.video_utils import VideoMetadata

    model, processor = hf_vl
    frames, metadata = video
    message = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(message, add_generation_prompt=True, tokenize=False)
    clock = VideoMetadata(**{k: v for k, v in metadata.items() if k != "do_sample_frames"})
    inputs = processor(text=[text], videos=[frames], video_metadata=[clock], return_tensors="pt",
                       add_special_tokens=False)
    return greedy_of(model, inputs, max_tokens)


VIDEO_SALTS = (0, 3)
"""Two videos (``video_frames``) of kinds the Qwen-VL checkpoints answer differently."""


def video_parts(salts: tuple[int, ...]) -> list[dict[str, Any]]:
    """One ``video_url`` part per salt: an mp4 of ``video_frames(salt)``."""
    return [video_part(mp4(video_frames(salt))) for salt in salts]


def assert_videos_equal_hf(checkpoint: Path, hf_vl: tuple[Any, Any], parts: list[dict[str, Any]],
                           responses: list[Any], max_tokens: int, log: Path) -> None:
    """Each chat of one video part (``responses``: the server's, in order) answered 200 with
    HF's prompt ids and greedy tokens for the frames vLLM decodes from that part; different
    videos gave different answers (the checkpoints asked tell the frames' kinds apart)."""
    answers = []
    for part, response in zip(parts, responses, strict=True):
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
        prompt, tokens = hf_generate_video(hf_vl, served_video(checkpoint, part), max_tokens)
        assert response.json()["prompt_token_ids"] == prompt
        assert response.json()["choices"][0]["token_ids"] == tokens
        answers.append(tuple(tokens))
    assert len(set(answers)) == len(answers), ("different videos give different answers", answers)


def wav(samples: Any, rate: int) -> bytes:
    """The bytes of a mono 16-bit PCM WAV file of these float samples (in [-1, 1]), written with
    the stdlib ``wave`` module (which writes integer PCM only)."""
    import wave

    import numpy as np

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.round(np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def audio_part(data: bytes) -> dict[str, Any]:
    """An OpenAI ``input_audio`` content part carrying these WAV bytes in base64."""
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


def served_audio(part: dict[str, Any]) -> tuple[Any, float]:
    """The (float32 waveform, sampling rate) ``vllm serve`` decodes from an ``input_audio`` part
    (vLLM's audio media IO, which needs the ``vllm[audio]`` extra); vLLM then resamples it to
    the processor's rate when the two differ."""
    from vllm.multimodal.media import AudioMediaIO

    audio = part["input_audio"]
    return AudioMediaIO().load_base64(f"audio/{audio['format']}", audio["data"])


LANES = 2
"""The VL serve tests run in lane mode: a Galaxy's mesh split into 2 lanes."""


def lane_serve(rows: int, trace: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """``vllm serve`` arguments and environment for ``LANES`` lanes of ``rows`` rows, with the
    lane coordinator's step trace written to ``trace``. Every program takes at least 20 ms of
    modelled device time, so that concurrent requests overlap on the engine even when a loaded
    machine hands them over slowly (placement goes to the least loaded lane: requests that
    never overlap would all land in lane 0)."""
    args = ("--max-num-seqs", str(rows), "--data-parallel-size", str(LANES), "--api-server-count", "1",
            "--additional-config.tt.host_device_time", "20ms")
    return args, {"MESH_DEVICE": "TG", "TT_STEP_TRACE": str(trace)}


def assert_every_lane_prefilled_an_image(trace: Path, log: Path, rows: int, text_only_tokens: int) -> None:
    """The server ran in lanes and each lane prefilled a prompt longer than the text-only one,
    i.e. one with an image (or another item: a video, a clip; requests go to the least loaded
    lane)."""
    assert f"{LANES} lanes x {rows} rows" in log.read_text()
    lanes: list[dict[str, int]] = [{} for _ in range(LANES)]
    for line in trace.read_text().splitlines():
        step = json.loads(line)
        if step["phase"] == "prefill":
            for lane, part in zip(lanes, step["lanes"], strict=True):
                for rid, tokens in part["scheduled"].items():
                    lane[rid] = lane.get(rid, 0) + tokens
    longest = [max(lane.values(), default=0) for lane in lanes]
    assert min(longest) > text_only_tokens, (longest, text_only_tokens)


def assert_outputs_equal_hf(keys: list[Any], results: Any, expected: list[tuple[list[int], list[int]]],
                            ) -> list[tuple[list[int], list[int]]]:
    """``vllm.LLM`` outputs ``results`` equal transformers' ``expected`` (prompt ids, greedy tokens)
    request by request (``keys`` name them in the failure); returns vLLM's."""
    got = [(list(r.prompt_token_ids), list(r.outputs[0].token_ids)) for r in results]
    assert [g[0] for g in got] == [e[0] for e in expected], "vLLM's expanded prompt ids equal HF's"
    mismatches = [(k, g[1], e[1]) for k, g, e in zip(keys, got, expected, strict=True) if g[1] != e[1]]
    assert not mismatches, mismatches
    return got
