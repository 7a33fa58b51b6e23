"""Block-output decode steps of host models (adaptive block output): ``decode_forward`` with
``block_tokens`` drafts with the model's own first layers and verifies with its full pass, so
each row commits exactly the tokens consecutive plain greedy decode steps give (1 up to its
limit, then -1), leaves the KV those steps would leave, and keeps the fixed shape of a trace.
The same drafter alone (``propose_drafts``) drafts for vLLM's verify steps."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.command_queue import CommandQueue
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice, TraceNotCapturedError
from vllm_tt_host.models.families import HostLlamaForCausalLM
from vllm_tt_host.models.frame.block_output import BLOCK_KWARG as HOST_BLOCK_KWARG
from vllm_tt_host.models.frame.block_output import draft_layers
from vllm_tt_host.models.frame.shapes import MAX_BLOCK_TOKENS, MAX_VERIFY_TOKENS, HostModelInputError
from vllm_tt_models_registry.contract import BLOCK_KWARG, check_model_class
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.decode_steps import clone_kv, prefilled

BLOCK = 16
ROWS = 4
WIDTH = 8
TRAIN_STEPS = 200


@pytest.fixture(scope="module")
def checkpoint():
    from vllm_tt_testing.checkpoints import cached_tiny

    return cached_tiny("llama", TRAIN_STEPS)  # trained: the early-exit drafter agrees now and then


def _model(checkpoint):
    model = HostLlamaForCausalLM.initialize_vllm_model(AutoConfig.from_pretrained(checkpoint),
                                                       HostMeshDevice(MeshShape(1, 1)), ROWS, WIDTH * BLOCK)
    cfg = model.config
    kv = model.allocate_kv_cache((40, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)
    return model, kv


def _plain_greedy(model, kv, table, last, starts, steps):
    """``steps`` plain decode steps per live row: each row's greedy tokens."""
    tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
    pos = torch.full((ROWS,), -1, dtype=torch.int32)
    for i, (token, start) in enumerate(zip(last, starts, strict=True)):
        tokens[i, 0], pos[i] = token, start
    got: list[list[int]] = [[] for _ in last]
    for _ in range(steps):
        out = model.decode_forward(tokens=tokens, start_pos=pos, page_table=table, kv_cache=kv)
        for i in range(len(last)):
            got[i].append(int(out[i, -1].argmax()))
            tokens[i, 0] = got[i][-1]
            pos[i] += 1
    return got


def test_declares_block_output_through_the_contract():
    caps = check_model_class(HostLlamaForCausalLM, owner="test")
    assert caps.max_block_tokens == MAX_BLOCK_TOKENS
    assert HOST_BLOCK_KWARG == BLOCK_KWARG


def test_blocks_equal_consecutive_greedy_decode_steps_and_their_kv(checkpoint):
    model, kv = _model(checkpoint)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12, 13] * 7, [40, 41, 42, 43]]
    table, first = prefilled(model, kv, prompts, ROWS, WIDTH)
    starts = [len(p) for p in prompts]
    plain_kv = clone_kv(kv)
    limits = [MAX_BLOCK_TOKENS, 3, 1]  # row 3 is padding
    expected = _plain_greedy(model, plain_kv, table, first, starts, MAX_BLOCK_TOKENS)

    tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
    tokens[:3, 0] = torch.tensor(first)
    start = torch.tensor([*starts, -1], dtype=torch.int32)
    out = model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv,
                               **{BLOCK_KWARG: torch.tensor([*limits, 0], dtype=torch.int32)})
    assert out.shape == (ROWS, MAX_BLOCK_TOKENS) and out.dtype == torch.int64
    committed = []
    for i, limit in enumerate(limits):
        row = out[i].tolist()
        n = row.index(-1) if -1 in row else len(row)
        assert 1 <= n <= limit and all(t == -1 for t in row[n:])
        assert row[:n] == expected[i][:n]  # the greedy tokens, whatever the drafter guessed
        committed.append(n)
    assert out[3].tolist() == [-1] * MAX_BLOCK_TOKENS
    assert committed[2] == 1
    # The KV of the input token and every committed token but the last is the plain steps'.
    for i, n in enumerate(committed):
        for layer, (k, v) in enumerate(kv[0]):
            for p in range(starts[i], starts[i] + n):
                page, offset = int(table[i, p // BLOCK]), p % BLOCK
                for cache, plain in ((k, plain_kv[0][layer][0]), (v, plain_kv[0][layer][1])):
                    assert torch.equal(cache[page, :, offset], plain[page, :, offset]), (i, layer, p)


def test_the_self_drafter_is_accepted_and_rejected_on_a_trained_model(checkpoint):
    """Precondition of the e2e tests: blocks of several lengths, so both acceptance and the
    correction token are exercised."""
    model, kv = _model(checkpoint)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12, 13] * 7, [40, 41, 42, 43], [60, 3, 77, 12, 9, 30]]
    table, last = prefilled(model, kv, prompts, ROWS, WIDTH)
    pos = [len(p) for p in prompts]
    lengths = set()
    for _ in range(6):
        out = model.decode_forward(tokens=torch.tensor(last, dtype=torch.int32)[:, None],
                                   start_pos=torch.tensor(pos, dtype=torch.int32), page_table=table, kv_cache=kv,
                                   **{BLOCK_KWARG: torch.full((ROWS,), 4, dtype=torch.int32)})
        for i in range(ROWS):
            row = [t for t in out[i].tolist() if t != -1]
            lengths.add(len(row))
            pos[i] += len(row)
            last[i] = row[-1]
    assert 1 in lengths and max(lengths) > 1, lengths


def test_block_inputs_are_checked_and_traced(checkpoint):
    model, kv = _model(checkpoint)
    table, first = prefilled(model, kv, [[5, 6, 7]], ROWS, WIDTH)
    tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
    tokens[0, 0] = first[0]
    start = torch.tensor([3, -1, -1, -1], dtype=torch.int32)
    with pytest.raises(HostModelInputError, match="at least 1 for live rows"):
        model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv,
                             **{BLOCK_KWARG: torch.zeros(ROWS, dtype=torch.int32)})
    with pytest.raises(HostModelInputError, match=f"in \\[0, {MAX_BLOCK_TOKENS}\\]"):
        model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv,
                             **{BLOCK_KWARG: torch.tensor([MAX_BLOCK_TOKENS + 1, 0, 0, 0], dtype=torch.int32)})
    limits = torch.tensor([4, 0, 0, 0], dtype=torch.int32)
    with pytest.raises(TraceNotCapturedError):
        model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv, enable_trace=True,
                             **{BLOCK_KWARG: limits})
    model.warmup_model_decode(kv_cache=kv, enable_trace=True, max_batch_size=ROWS, num_blocks=WIDTH,
                              **{BLOCK_KWARG: 4})
    model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv, enable_trace=True,
                         **{BLOCK_KWARG: limits})


# -- the same drafter alone: the model's own drafts for vLLM's verify steps (custom_class) -----

def test_declares_its_own_drafter_through_the_contract():
    caps = check_model_class(HostLlamaForCausalLM, owner="test")
    assert caps.max_model_drafts == MAX_VERIFY_TOKENS - 1


def _draft_inputs(first, starts, counts):
    tokens = torch.zeros(ROWS, 1, dtype=torch.int32)
    start = torch.full((ROWS,), -1, dtype=torch.int32)
    num = torch.zeros(ROWS, dtype=torch.int32)
    for i, (token, pos, n) in enumerate(zip(first, starts, counts, strict=True)):
        tokens[i, 0], start[i], num[i] = token, pos, n
    return tokens, start, num


def test_model_drafts_are_the_half_depth_models_greedy_tokens_and_leave_the_target_exact(checkpoint):
    """The drafts are what transformers' model cut to its first ``draft_layers`` layers (norm
    and head kept) continues greedily, and the target's next steps are unchanged by them."""
    from transformers import AutoModelForCausalLM

    model, kv = _model(checkpoint)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12, 13] * 7, [40, 41, 42, 43]]
    table, first = prefilled(model, kv, prompts, ROWS, WIDTH)
    starts = [len(p) for p in prompts]
    untouched = clone_kv(kv)
    counts = [MAX_VERIFY_TOKENS - 1, 2, 0]
    tokens, start, num = _draft_inputs(first, starts, counts)
    drafts = model.propose_drafts(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv, num_drafts=num)
    assert drafts.shape == (ROWS, MAX_VERIFY_TOKENS - 1)

    half = AutoModelForCausalLM.from_pretrained(checkpoint, num_hidden_layers=draft_layers(model.config.num_layers),
                                                torch_dtype=torch.float32).eval()
    for i, (prompt, n) in enumerate(zip(prompts, counts, strict=True)):
        row = drafts[i].tolist()
        assert row[n:] == [-1] * (len(row) - n)
        ids = [*prompt, first[i]]
        with torch.no_grad():  # greedy past any end-of-text token, as the drafter does
            for _ in range(n):
                ids.append(int(half(torch.tensor([ids])).logits[0, -1].argmax()))
        assert row[:n] == ids[len(prompt) + 1 :], i
    assert drafts[3].tolist() == [-1] * (MAX_VERIFY_TOKENS - 1)
    # The target's own steps after the drafts are the steps without them.
    assert _plain_greedy(model, kv, table, first, starts, 4) == _plain_greedy(model, untouched, table, first, starts, 4)


def test_model_draft_inputs_are_checked(checkpoint):
    model, kv = _model(checkpoint)
    table, first = prefilled(model, kv, [[5, 6, 7]], ROWS, WIDTH)
    tokens, start, num = _draft_inputs(first, [3], [1])
    num[1] = 2  # a padding row asking for drafts
    with pytest.raises(HostModelInputError, match="0 for padding rows"):
        model.propose_drafts(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv, num_drafts=num)
    num[1], num[0] = 0, MAX_VERIFY_TOKENS
    with pytest.raises(HostModelInputError, match=f"in \\[0, {MAX_VERIFY_TOKENS - 1}\\]"):
        model.propose_drafts(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv, num_drafts=num)


def test_the_drafter_costs_half_the_timed_models_layers_on_the_modelled_clock(checkpoint):
    """Timed as Llama 3.1 8B (32 layers), the two-layer tiny model's one-layer drafter costs 16
    of 8B's layers per pass, not one: a one-draft proposal takes about half a decode step."""
    sleeps: list[float] = []
    queue = CommandQueue(timed=True, clock=lambda: 0.0, sleep=sleeps.append)
    mesh = HostMeshDevice(MeshShape(1, 1), options=HostDeviceOptions(device_time=parse_device_time(
        "llama-3.1-8b@N150")), command_queue=queue)
    model = HostLlamaForCausalLM.initialize_vllm_model(AutoConfig.from_pretrained(checkpoint), mesh, ROWS,
                                                       WIDTH * BLOCK)
    cfg = model.config
    kv = model.allocate_kv_cache((40, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)
    table, first = prefilled(model, kv, [[5, 6, 7]], ROWS, WIDTH)
    tokens, start, num = _draft_inputs(first, [3], [1])
    model.propose_drafts(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv, num_drafts=num)
    draft_s = sleeps[-1]
    model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv)
    decode_s = sleeps[-1]
    assert 0.4 < draft_s / decode_s < 0.65, (draft_s, decode_s)
    queue.close()
