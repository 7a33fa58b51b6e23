"""The host models' side of overlapped decode: the device keeps each slot's token and position
between device-sampled decodes, decode handles and event-gated readbacks under modelled time,
and the skip-math stand-in."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.command_queue import CommandQueue
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice
from vllm_tt_host.models.families import HostLlamaForCausalLM
from vllm_tt_host.models.frame.readback import DecodeHandle, DeviceReadError, HostReadback
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.faults import DelayPoint, Faults
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_sampling.params import TTSamplingParams

ROWS = 2
BLOCK = 16
WIDTH = 8


def build(tiny_checkpoint, options: HostDeviceOptions | None = None, queue: CommandQueue | None = None):
    mesh = HostMeshDevice(MeshShape(1, 1), options=options, command_queue=queue)
    config = AutoConfig.from_pretrained(tiny_checkpoint("llama"))
    model = HostLlamaForCausalLM.initialize_vllm_model(config, mesh, ROWS, WIDTH * BLOCK)
    cfg = model.config
    kv = model.allocate_kv_cache((1 + ROWS * WIDTH, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32,
                                 cfg.num_layers)
    return model, kv


def table() -> torch.Tensor:
    """Slot ``s`` owns blocks ``1 + s*WIDTH ...`` (block 0 is the null block)."""
    return torch.stack([torch.arange(WIDTH, dtype=torch.int32) + 1 + s * WIDTH for s in range(ROWS)])


def greedy(rows: int = ROWS) -> TTSamplingParams:
    return TTSamplingParams.neutral(rows)


def prefill(model, kv, slot: int, prompt: list[int]) -> int:
    tokens = model.prefill_forward(
        tokens=torch.tensor([prompt], dtype=torch.int32), page_table=table()[slot : slot + 1], kv_cache=kv,
        prompt_lens=[len(prompt)], start_pos=[0], empty_slots=[slot], sampling_params=greedy(1),
    )
    return int(tokens[0])


def decode(model, kv, feed: dict[int, tuple[int, int]], **kwargs):
    """One decode step; ``feed[slot] = (token, position)``, other slots are padding."""
    tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
    start = torch.full((ROWS,), -1, dtype=torch.int32)
    for slot, (token, position) in feed.items():
        tokens[slot, 0], start[slot] = token, position
    kwargs.setdefault("sampling_params", greedy())
    return model.decode_forward(tokens=tokens, start_pos=start, page_table=table(), kv_cache=kv, **kwargs)


def reference(tiny_checkpoint, prompts: dict[int, list[int]], steps: int) -> dict[int, list[int]]:
    """Tokens of each slot when the host always feeds the right token (no overlap)."""
    model, kv = build(tiny_checkpoint)
    out = {slot: [prefill(model, kv, slot, p)] for slot, p in prompts.items()}
    for step in range(steps):
        sampled = decode(model, kv, {s: (out[s][-1], len(prompts[s]) + step) for s in prompts}, reset_batch=step == 0)
        for slot in prompts:
            out[slot].append(int(sampled[slot]))
    return out


PROMPTS = {0: [5, 9, 13, 17, 21], 1: [7, 3, 11]}


class DeviceInputs:
    """Counts the slot inputs ``model``'s decodes take from device state (``DeviceSlots.device_rows``)."""

    def __init__(self, model) -> None:
        self.taken = 0
        rows = model.slots.device_rows

        def counted(*args, **kwargs):
            use = rows(*args, **kwargs)
            self.taken += int(use.sum())
            return use

        model.slots.device_rows = counted


def test_device_is_authoritative_for_continuing_slots(tiny_checkpoint):
    """The runner may send a stale token (the host has not seen the last one yet): the device
    feeds its own sampled token instead, so the result equals feeding the right one."""
    expected = reference(tiny_checkpoint, PROMPTS, steps=4)
    model, kv = build(tiny_checkpoint)
    device = DeviceInputs(model)
    got = {slot: [prefill(model, kv, slot, p)] for slot, p in PROMPTS.items()}
    stale = {slot: got[slot][0] for slot in PROMPTS}  # the host never learns later tokens
    for step in range(4):
        sampled = decode(model, kv, {s: (stale[s], len(PROMPTS[s]) + step) for s in PROMPTS}, reset_batch=step == 0)
        for slot in PROMPTS:
            got[slot].append(int(sampled[slot]))
    assert got == expected
    assert device.taken == 2 * 3  # the first decode took the prefilled host tokens


def test_host_inputs_after_prefill_host_sampling_and_reset(tiny_checkpoint):
    model, kv = build(tiny_checkpoint)
    device = DeviceInputs(model)
    first = prefill(model, kv, 0, PROMPTS[0])
    pos = len(PROMPTS[0])
    decode(model, kv, {0: (first, pos)}, reset_batch=True)
    assert device.taken == 0  # fresh after prefill: host token
    decode(model, kv, {0: (first, pos + 1)})
    assert device.taken == 1
    decode(model, kv, {0: (first, pos + 2)}, sampling_params=None)  # host sampling: device state dropped
    decode(model, kv, {0: (first, pos + 3)}, reset_batch=True)
    assert device.taken == 1
    # A reset keeps device inputs only where the device position is the host's (or one ahead).
    decode(model, kv, {0: (first, pos + 4)}, reset_batch=True)
    assert device.taken == 2
    decode(model, kv, {0: (first, pos + 1)}, reset_batch=True)
    assert device.taken == 2
    prefill(model, kv, 0, PROMPTS[0])
    decode(model, kv, {0: (first, pos)}, reset_batch=False)  # re-prefilled: host token again
    assert device.taken == 2


def test_a_layout_change_without_reset_is_an_error(tiny_checkpoint):
    model, kv = build(tiny_checkpoint)
    first = prefill(model, kv, 0, PROMPTS[0])
    pos = len(PROMPTS[0])
    decode(model, kv, {0: (first, pos)}, reset_batch=True)
    with pytest.raises(HostModelInputError, match="device position 6, host position 8, and no reset_batch"):
        decode(model, kv, {0: (first, pos + 3)})


class Gate(Faults):
    """Holds every readback until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def delay(self, point: DelayPoint) -> None:
        if point is DelayPoint.READBACK:
            self.open.wait()


def test_readback_is_event_gated_under_modelled_time(tiny_checkpoint):
    expected = reference(tiny_checkpoint, {0: PROMPTS[0]}, steps=1)[0]
    model, kv = build(tiny_checkpoint, HostDeviceOptions(device_time=parse_device_time("0ms")))
    gate = Gate()
    model.device.faults = gate
    first = prefill(model, kv, 0, PROMPTS[0])
    handle = decode(model, kv, {0: (first, len(PROMPTS[0]))}, read_from_device=False, reset_batch=True)
    assert isinstance(handle, DecodeHandle) and handle.sampled and handle.nbytes == ROWS * 8
    readback, events = model.read_decode_output(handle, async_read=True)
    assert isinstance(readback, HostReadback) and len(events) == 1 and not events[0].recorded
    with pytest.raises(DeviceReadError, match="before its readback event was synchronised"):
        model.process_decode_output_host(readback, is_tokens=True)
    gate.open.set()
    model.device.event_synchronize(events[0])
    tokens = model.process_decode_output_host(readback, is_tokens=True)
    assert [first, int(tokens[0])] == expected
    model.device.close()


def test_sync_reads_of_handles_and_blocking_decode(tiny_checkpoint):
    model, kv = build(tiny_checkpoint, HostDeviceOptions(device_time=parse_device_time("0ms")))
    first = prefill(model, kv, 0, PROMPTS[0])
    pos = len(PROMPTS[0])
    handle = decode(model, kv, {0: (first, pos)}, read_from_device=False, sampling_params=None)
    logits = model.process_decode_output_host(handle)  # the sync path hands over the raw handle
    assert logits.shape == (ROWS, 1, model.config.vocab_size)
    out, events = model.read_decode_output(decode(model, kv, {0: (first, pos)}, read_from_device=False,
                                                  sampling_params=None), async_read=False)
    assert events == [] and torch.equal(model.process_decode_output_host(out), logits)
    direct = decode(model, kv, {0: (first, pos)}, read_from_device=True, sampling_params=None)
    assert isinstance(direct, torch.Tensor) and torch.equal(direct, logits)
    assert model.read_decode_output(direct, async_read=True) == (direct, [])
    model.device.close()


def test_programs_take_the_cost_models_time(tiny_checkpoint):
    """Each program asks the device for exactly its modelled duration (fake clock: the math
    takes no time, so the sleep is the whole duration)."""
    sleeps: list[float] = []
    queue = CommandQueue(timed=True, clock=lambda: 0.0, sleep=sleeps.append)
    options = HostDeviceOptions(device_time=parse_device_time("llama-3.1-8b@N150"), skip_math=True)
    model, kv = build(tiny_checkpoint, options, queue)
    first = prefill(model, kv, 0, PROMPTS[0])
    handle = decode(model, kv, {0: (first, 5), 1: (first, 9)}, read_from_device=False, reset_batch=True)
    model.read_decode_output(handle, async_read=False)
    costs = model.costs
    assert sleeps == [pytest.approx(costs.prefill_s(5, 0)), pytest.approx(costs.decode_s(6 + 10)),
                      pytest.approx(costs.readback_s(ROWS * 8))]
    queue.close()


def test_skip_math_tokens_depend_on_input_token_and_position(tiny_checkpoint):
    model, kv = build(tiny_checkpoint, HostDeviceOptions(skip_math=True))
    assert model.synthetic is not None and not model.queue.deferred
    logits = decode(model, kv, {0: (40, 7), 1: (40, 7)}, sampling_params=None)[:, 0]
    assert torch.equal(logits[0], logits[1])
    other_token = decode(model, kv, {0: (41, 7)}, sampling_params=None)[0, 0]
    other_position = decode(model, kv, {0: (40, 8)}, sampling_params=None)[0, 0]
    assert not torch.equal(other_token, logits[0]) and not torch.equal(other_position, logits[0])
    # Prefill ends on the same (token, position): the same next-token distribution.
    prompt = [3, 9, 27, 40]
    row = model.prefill_forward(tokens=torch.tensor([[*prompt, 0, 0, 0, 0]]), page_table=table()[:1], kv_cache=kv,
                                prompt_lens=[8], start_pos=[0], empty_slots=[0])
    assert row.shape == (1, 1, model.config.vocab_size)
    at_seven = model.prefill_forward(tokens=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 40]]), page_table=table()[:1],
                                     kv_cache=kv, prompt_lens=[8], start_pos=[0], empty_slots=[0])
    assert torch.equal(at_seven[0, 0], logits[0])


LANES = 4


def build_lanes(tiny_checkpoint, device_time: str, queue: CommandQueue):
    """A TG split into ``LANES`` sub-meshes of ``ROWS`` rows each (slot ``s`` is in lane ``s // ROWS``)."""
    options = HostDeviceOptions(device_time=parse_device_time(device_time), skip_math=True, preset="TG")
    mesh = HostMeshDevice(MeshShape(8, 4), options=options, command_queue=queue)
    config = AutoConfig.from_pretrained(tiny_checkpoint("llama"))
    model = HostLlamaForCausalLM.initialize_vllm_model(config, mesh, LANES * ROWS, WIDTH * BLOCK,
                                                       tt_data_parallel=LANES)
    cfg = model.config
    kv = model.allocate_kv_cache((1 + ROWS * WIDTH, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32,
                                 cfg.num_layers)
    return model, kv


def lane_prefill(model, kv, prompts: dict[int, list[int]]) -> None:
    """One prefill call with a row per slot; slot ``s`` uses its lane's blocks of slot ``s % ROWS``."""
    length = max(map(len, prompts.values()))
    tokens = torch.tensor([p + [0] * (length - len(p)) for p in prompts.values()], dtype=torch.int32)
    model.prefill_forward(tokens=tokens, page_table=table()[[s % ROWS for s in prompts]], kv_cache=kv,
                          prompt_lens=[len(p) for p in prompts.values()], start_pos=[0] * len(prompts),
                          empty_slots=list(prompts), sampling_params=greedy(len(prompts)))


def test_lane_prefill_takes_the_busiest_lanes_time_not_the_sum(tiny_checkpoint):
    """Each lane's prefill rows run on its own sub-mesh, side by side with the other lanes': a
    call with two rows in lane 0 and one in lane 1 takes two rows' time (the sum would be three)."""
    sleeps: list[float] = []
    queue = CommandQueue(timed=True, clock=lambda: 0.0, sleep=sleeps.append)
    model, kv = build_lanes(tiny_checkpoint, "10ms", queue)
    lane_prefill(model, kv, {0: [5, 9, 13], 1: [7, 3], ROWS: [4, 4, 4, 4]})
    assert sleeps == [pytest.approx(0.020)]
    queue.close()


def test_lane_programs_are_costed_per_sub_mesh(tiny_checkpoint):
    """The cost model times one (2,4) sub-mesh of the TG; a program lasts as long as its
    busiest lane (prefill: that lane's rows in turn; decode: the lane reading the most KV)."""
    sleeps: list[float] = []
    queue = CommandQueue(timed=True, clock=lambda: 0.0, sleep=sleeps.append)
    model, kv = build_lanes(tiny_checkpoint, "served", queue)
    costs = model.costs
    assert costs.mesh.devices == 8 and "(2,4) sub-meshes" in costs.description
    lane_prefill(model, kv, {0: [5] * 40, 1: [7] * 40, 2 * ROWS: [4] * 100})
    assert sleeps == [pytest.approx(max(2 * costs.prefill_s(40, 0), costs.prefill_s(100, 0)))]
    start = torch.full((LANES * ROWS,), -1, dtype=torch.int32)
    start[0], start[1], start[2 * ROWS] = 40, 40, 100
    handle = model.decode_forward(tokens=torch.zeros(LANES * ROWS, 1, dtype=torch.int32), start_pos=start,
                                  page_table=torch.cat([table()] * LANES), kv_cache=kv, read_from_device=False,
                                  sampling_params=greedy(LANES * ROWS), reset_batch=True)
    model.read_decode_output(handle, async_read=False)
    assert sleeps[1] == pytest.approx(costs.decode_s(101))  # lane 2 (101) reads more than lane 0 (82)
    queue.close()
