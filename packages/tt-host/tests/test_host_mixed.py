"""Mixed steps of host models (``mixed_forward``): the decode rows and one prompt chunk in one
program give exactly what a decode step and a prefill step run separately give (decode logits,
the chunk's last-token logits when it ends the prompt) and leave the same KV, for the dense
family (Llama) and a hybrid-KV one (Gemma 3: sliding and full layers, one page table per layer);
a chunk no declared shape holds is refused before any KV is written; each shape is a captured
trace; on the modelled clock a mixed step reads the weights once."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice, TraceNotCapturedError
from vllm_tt_host.models.families import HostLlamaForCausalLM
from vllm_tt_host.models.frame.shapes import MIXED_SHAPES, HostModelInputError
from vllm_tt_host.models.gemma3.model import HostGemma3ForCausalLM
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.decode_steps import clone_kv, prefilled

BLOCK = 16
ROWS = 4
WIDTH = 16
"""Pages per row: 256 positions."""
TRAIN_STEPS = 200
CHUNK_SLOT = 3
LONG_PROMPT = [(7 * i + 3) % 90 + 5 for i in range(150)]
"""The prompt the mixed steps prefill in two chunks (100, then 50 tokens), beside the decodes."""


def _build(family: str, mesh: HostMeshDevice | None = None):
    from vllm_tt_testing.checkpoints import cached_tiny

    cls = HostLlamaForCausalLM if family == "llama" else HostGemma3ForCausalLM
    folder = cached_tiny(family, TRAIN_STEPS)
    model = cls.initialize_vllm_model(AutoConfig.from_pretrained(folder), mesh or HostMeshDevice(MeshShape(1, 1)),
                                      ROWS, WIDTH * BLOCK)
    cfg = model.config
    shape = (1 + ROWS * WIDTH, cfg.num_kv_heads, BLOCK, cfg.head_dim)
    if family == "llama":
        kv = model.allocate_kv_cache(shape, torch.float32, cfg.num_layers)
    else:  # one KV tensor per layer; the sliding layers read only their window
        kv = model.allocate_kv_cache_per_layer([(shape, torch.float32, i) for i in range(cfg.num_layers)])
    return model, kv


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def built(family):
    return _build(family)


def _prefilled(model, kv, prompts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """``prefilled`` into slots 0..; the chunk's slot gets its own pages too."""
    table, first = prefilled(model, kv, prompts, ROWS, WIDTH)
    table[CHUNK_SLOT] = torch.arange(1 + CHUNK_SLOT * WIDTH, 1 + (CHUNK_SLOT + 1) * WIDTH)
    return table, first


def _per_layer(model, family: str, table: torch.Tensor) -> dict:
    """Gemma 3 gets one table per layer (the hybrid-KV calls), Llama none."""
    return {} if family == "llama" else {"page_tables_per_layer": [table] * model.config.num_layers}


def _chunk_kwargs(model, family: str, table: torch.Tensor, start: int, end: int) -> dict:
    chunk_table = table[CHUNK_SLOT : CHUNK_SLOT + 1]
    kwargs = {"chunk_tokens": torch.tensor([LONG_PROMPT[:end]], dtype=torch.int32), "chunk_start": start,
              "chunk_page_table": chunk_table, "chunk_slot": CHUNK_SLOT, "chunk_completes": end == len(LONG_PROMPT)}
    if family != "llama":
        kwargs["chunk_page_tables_per_layer"] = [chunk_table] * model.config.num_layers
    return kwargs


def _decode_batch(last: list[int], starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
    pos = torch.full((ROWS,), -1, dtype=torch.int32)
    for slot, (token, start) in enumerate(zip(last, starts, strict=True)):
        tokens[slot, 0], pos[slot] = token, start
    return tokens, pos


def test_llama_and_gemma3_text_declare_mixed_shapes_through_the_contract():
    for cls in (HostLlamaForCausalLM, HostGemma3ForCausalLM):
        assert check_model_class(cls, owner="test").mixed_shapes == MIXED_SHAPES


def test_mixed_steps_equal_a_decode_step_and_a_prefill_step_with_the_same_kv(built, family):
    model, kv = built
    prompts = [[5, 9, 13, 17, 21], [30, 31, 32], [40, 41, 42, 43, 44, 45, 46]]
    table, first = _prefilled(model, kv, prompts)
    separate, mixed = clone_kv(kv), clone_kv(kv)
    last, starts = list(first), [len(p) for p in prompts]
    for start, end in ((0, 100), (100, len(LONG_PROMPT))):
        tokens, pos = _decode_batch(last, starts)
        decode = model.decode_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=separate,
                                      **_per_layer(model, family, table))
        chunk = _chunk_kwargs(model, family, table, start, end)
        prefill = model.prefill_forward(tokens=chunk["chunk_tokens"], page_table=chunk["chunk_page_table"],
                                        kv_cache=separate, prompt_lens=[end], start_pos=[start],
                                        empty_slots=[CHUNK_SLOT], **_per_layer(model, family, chunk["chunk_page_table"]))
        got_decode, got_chunk = model.mixed_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=mixed,
                                                    enable_trace=False, **_per_layer(model, family, table), **chunk)
        live = pos >= 0  # a padding row's output means nothing
        assert torch.equal(got_decode[live], decode[live])  # bitwise: the same ops on the same shapes
        if chunk["chunk_completes"]:
            assert got_chunk is not None and torch.equal(got_chunk, prefill)
        else:
            assert got_chunk is None  # the prompt goes on: nothing to sample
        last = [int(decode[s, -1].argmax()) for s in range(len(prompts))]
        starts = [s + 1 for s in starts]
    for lane_a, lane_b in zip(separate, mixed, strict=True):
        for (k_a, v_a), (k_b, v_b) in zip(lane_a, lane_b, strict=True):
            assert torch.equal(k_a, k_b) and torch.equal(v_a, v_b)


def test_a_chunk_no_declared_shape_holds_is_refused_before_any_kv_is_written(built, family):
    model, kv = built
    table, first = _prefilled(model, kv, [[5, 6, 7]])
    before = clone_kv(kv)
    tokens, pos = _decode_batch(first, [3])
    too_long = max(c for _, c in MIXED_SHAPES) + 1
    chunk = _chunk_kwargs(model, family, table, 0, too_long)
    with pytest.raises(HostModelInputError, match="fits none of the declared mixed_shapes"):
        model.mixed_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv, enable_trace=False,
                            **_per_layer(model, family, table), **chunk)
    bad_slot = {**_chunk_kwargs(model, family, table, 0, 10), "chunk_slot": 0}
    with pytest.raises(HostModelInputError, match="chunk_slot 0 is also a live decode row"):
        model.mixed_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv, enable_trace=False,
                            **_per_layer(model, family, table), **bad_slot)
    for lane_a, lane_b in zip(before, kv, strict=True):
        for (k_a, _), (k_b, _) in zip(lane_a, lane_b, strict=True):
            assert torch.equal(k_a, k_b)


def test_each_mixed_shape_is_a_captured_trace():
    model, kv = _build("llama")
    table, first = _prefilled(model, kv, [[5, 6, 7]])
    tokens, pos = _decode_batch(first, [3])
    chunk = _chunk_kwargs(model, "llama", table, 0, 20)
    with pytest.raises(TraceNotCapturedError):
        model.mixed_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv, enable_trace=True, **chunk)
    model.warmup_model_decode(kv_cache=kv, enable_trace=True, max_batch_size=ROWS, num_blocks=WIDTH,
                              mixed_shapes=MIXED_SHAPES)
    decode, _ = model.mixed_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv, enable_trace=True,
                                    **chunk)
    assert decode.shape == (ROWS, 1, model.config.vocab_size)


def test_on_the_modelled_clock_a_mixed_step_reads_the_weights_once():
    """Llama-3.1-8B's roofline on an N150 (math skipped): the mixed step costs less than the
    decode step and the prefill step it replaces, and no less than either."""
    mesh = HostMeshDevice(MeshShape(1, 1), options=HostDeviceOptions(
        device_time=parse_device_time("llama-3.1-8b"), skip_math=True))
    model, kv = _build("llama", mesh)
    table, first = _prefilled(model, kv, [[5, 6, 7], [8, 9]])
    tokens, pos = _decode_batch(first, [3, 2])
    chunk = _chunk_kwargs(model, "llama", table, 0, 100)

    def timed(call) -> float:
        before = mesh.modelled_device_seconds
        call()
        return mesh.modelled_device_seconds - before

    decode = timed(lambda: model.decode_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv))
    prefill = timed(lambda: model.prefill_forward(
        tokens=chunk["chunk_tokens"], page_table=chunk["chunk_page_table"], kv_cache=kv, prompt_lens=[100],
        start_pos=[0], empty_slots=[CHUNK_SLOT]))
    mixed = timed(lambda: model.mixed_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv,
                                              enable_trace=False, **chunk))
    mesh.close()
    assert max(decode, prefill) <= mixed < decode + prefill, (decode, prefill, mixed)
