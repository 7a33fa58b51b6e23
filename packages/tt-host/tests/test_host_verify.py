"""Verify steps of host models (speculative decoding): ``decode_forward`` over ``[B, 1 + K]``
tokens returns, at every real position, exactly the logits consecutive plain decode steps give
there, writes the KV of every real position, and keeps the fixed shapes of a trace. Verified on
the device (greedy ``sampling_params``) it returns the argmax of those logits, and the modelled
readback moves only the token ids."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.command_queue import CommandQueue
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice, TraceNotCapturedError
from vllm_tt_host.models.families import HostLlamaForCausalLM
from vllm_tt_host.models.frame.shapes import HostModelInputError, TraceKey
from vllm_tt_host.models.frame.verify import VERIFY_KWARG as HOST_VERIFY_KWARG
from vllm_tt_host.models.gemma3.model import HostGemma3ForCausalLM
from vllm_tt_models_registry.contract import VERIFY_KWARG, check_model_class
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_sampling.params import TTSamplingParams
from vllm_tt_testing.decode_steps import clone_kv, prefilled

BLOCK = 16
ROWS = 4
WIDTH = 8
K = 3


def _model(tiny_checkpoint, cls, arch, mesh=None):
    config = AutoConfig.from_pretrained(tiny_checkpoint(arch))
    model = cls.initialize_vllm_model(config, mesh or HostMeshDevice(MeshShape(1, 1)), ROWS, WIDTH * BLOCK)
    cfg = model.config
    kv = model.allocate_kv_cache((40, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)
    return model, kv


@pytest.mark.parametrize(("cls", "arch"), [(HostLlamaForCausalLM, "llama"), (HostGemma3ForCausalLM, "gemma3")])
def test_verify_logits_equal_consecutive_decode_steps(tiny_checkpoint, cls, arch):
    model, kv = _model(tiny_checkpoint, cls, arch)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12, 13] * 7]
    table, first = prefilled(model, kv, prompts, ROWS, WIDTH)
    drafts = [[21, 22, 23], [31]]  # row 0 full, row 1 one draft; rows 2-3 padding
    seqs = [[first[i], *drafts[i]] for i in range(2)]
    starts = [len(p) for p in prompts]

    plain_kv = clone_kv(kv)
    expected = {}
    for j in range(1 + K):
        tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
        pos = torch.full((ROWS,), -1, dtype=torch.int32)
        for i, seq in enumerate(seqs):
            if j < len(seq):
                tokens[i, 0], pos[i] = seq[j], starts[i] + j
        out = model.decode_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=plain_kv)
        for i, seq in enumerate(seqs):
            if j < len(seq):
                expected[i, j] = out[i, -1]

    tokens = torch.zeros(ROWS, 1 + K, dtype=torch.int32)
    for i, seq in enumerate(seqs):
        tokens[i, : len(seq)] = torch.tensor(seq)
    start = torch.tensor([starts[0], starts[1], -1, -1], dtype=torch.int32)
    valid = torch.tensor([4, 2, 0, 0], dtype=torch.int32)
    out = model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv,
                               **{VERIFY_KWARG: valid})
    assert out.shape == (ROWS, 1 + K, model.config.vocab_size)
    for (i, j), logits in expected.items():
        assert torch.equal(out[i, j], logits), (i, j)
    for lane, plain_lane in zip(kv, plain_kv, strict=True):  # the same KV was written
        for pair, plain_pair in zip(lane, plain_lane, strict=True):
            assert all(torch.equal(a, b) for a, b in zip(pair, plain_pair, strict=True))


def test_verify_is_one_traced_shape_per_k_and_checks_its_inputs(tiny_checkpoint):
    model, kv = _model(tiny_checkpoint, HostLlamaForCausalLM, "llama")
    table, first = prefilled(model, kv, [[5, 6, 7]], ROWS, WIDTH)
    tokens = torch.zeros(ROWS, 1 + K, dtype=torch.int32)
    tokens[0, :2] = torch.tensor([first[0], 9])
    start = torch.tensor([3, -1, -1, -1], dtype=torch.int32)
    call = {"tokens": tokens, "start_pos": start, "page_table": table, "kv_cache": kv}
    with pytest.raises(TraceNotCapturedError):  # not captured by warmup yet
        model.decode_forward(enable_trace=True, **call, **{VERIFY_KWARG: torch.tensor([2, 0, 0, 0])})
    model.warmup_model_decode(kv_cache=kv, enable_trace=True, max_batch_size=ROWS, num_blocks=WIDTH,
                              verify_tokens=1 + K)
    assert TraceKey.verify(ROWS, 1 + K) in model.lanes.devices[0].captured_traces
    model.decode_forward(enable_trace=True, **call, **{VERIFY_KWARG: torch.tensor([2, 0, 0, 0])})
    with pytest.raises(HostModelInputError, match="num_valid_tokens"):
        model.decode_forward(**call, **{VERIFY_KWARG: torch.tensor([5, 0, 0, 0])})
    assert HOST_VERIFY_KWARG == VERIFY_KWARG
    assert check_model_class(HostLlamaForCausalLM, owner="host").supports_verify_decode


def _verify_call(model, kv):
    """A verify step of two rows (three drafts, one draft) after their prefills; rows 2-3 padding."""
    table, first = prefilled(model, kv, [[5, 6, 7, 8, 9] * 3, [11, 12, 13] * 7], ROWS, WIDTH)
    tokens = torch.zeros(ROWS, 1 + K, dtype=torch.int32)
    tokens[0], tokens[1, :2] = torch.tensor([first[0], 21, 22, 23]), torch.tensor([first[1], 31])
    start = torch.tensor([15, 21, -1, -1], dtype=torch.int32)
    return {"tokens": tokens, "start_pos": start, "page_table": table, VERIFY_KWARG: torch.tensor([4, 2, 0, 0])}


def test_device_verify_returns_each_positions_argmax_and_reads_back_only_ids(tiny_checkpoint):
    sleeps: list[float] = []
    queue = CommandQueue(timed=True, clock=lambda: 0.0, sleep=sleeps.append)
    mesh = HostMeshDevice(MeshShape(1, 1), options=HostDeviceOptions(device_time=parse_device_time(
        "llama-3.1-8b@N150")), command_queue=queue)
    model, kv = _model(tiny_checkpoint, HostLlamaForCausalLM, "llama", mesh)
    call = _verify_call(model, kv)
    host_kv = clone_kv(kv)
    logits = model.decode_forward(kv_cache=host_kv, **call)
    host_s = sleeps[-1]
    ids = model.decode_forward(kv_cache=kv, sampling_params=TTSamplingParams.neutral(ROWS), **call)
    device_s = sleeps[-1]
    assert ids.shape == (ROWS, 1 + K) and not ids.is_floating_point()
    for i, valid in enumerate(call[VERIFY_KWARG].tolist()):
        assert ids[i, :valid].tolist() == logits[i, :valid].argmax(dim=-1).tolist()
    for lane, host_lane in zip(kv, host_kv, strict=True):  # the same KV was written
        for pair, host_pair in zip(lane, host_lane, strict=True):
            assert all(torch.equal(a, b) for a, b in zip(pair, host_pair, strict=True))
    positions, vocab = ROWS * (1 + K), model.config.vocab_size
    saved = model.costs.readback_s(positions * vocab * 4) - model.costs.readback_s(positions * 4)
    assert host_s - device_s == pytest.approx(saved) and saved > 0
    queue.close()


def test_device_verify_is_its_own_trace_and_takes_greedy_rows_only(tiny_checkpoint):
    model, kv = _model(tiny_checkpoint, HostLlamaForCausalLM, "llama")
    call = _verify_call(model, kv)
    model.warmup_model_decode(kv_cache=kv, enable_trace=True, max_batch_size=ROWS, num_blocks=WIDTH,
                              can_sample_on_device=True, verify_tokens=1 + K)
    captured = model.lanes.devices[0].captured_traces
    assert {TraceKey.verify(ROWS, 1 + K), TraceKey.verify(ROWS, 1 + K, True)} <= set(captured)
    model.decode_forward(kv_cache=kv, enable_trace=True, sampling_params=TTSamplingParams.neutral(ROWS), **call)
    sampled = TTSamplingParams.neutral(ROWS)
    sampled.temperature[0] = 0.8
    with pytest.raises(HostModelInputError, match="greedy sampling_params rows"):
        model.decode_forward(kv_cache=kv, sampling_params=sampled, **call)
