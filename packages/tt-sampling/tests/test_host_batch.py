"""``HostSamplingBatch``: vLLM's sampler over fixed slots, with vLLM's thinking-token budget."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm_tt_sampling.host import HostSamplingBatch
from vllm_tt_sampling.host.logprobs import gather_logprobs

VOCAB = 64
EOS = 2


def make_vllm_config(max_num_seqs: int = 8, logits_processors=None) -> SimpleNamespace:
    """The parts of ``VllmConfig`` the host sampler reads. A real ``VllmConfig`` runs the active
    platform's ``check_and_update_config``, which unit tests of sampling must not depend on;
    ``test_compat.py`` checks these attribute names against vLLM's config classes."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        model_config=SimpleNamespace(logits_processors=logits_processors, logprobs_mode="raw_logprobs"),
        speculative_config=None,
    )


def batch(num_slots: int = 4, **kwargs) -> HostSamplingBatch:
    return HostSamplingBatch(num_slots, VOCAB, make_vllm_config(), **kwargs)


def peaked(*order: int) -> torch.Tensor:
    """Logits whose greedy ranking starts with ``order`` (first = best)."""
    row = torch.zeros(VOCAB)
    for rank, token in enumerate(order):
        row[token] = 10.0 - rank
    return row


def add(b, slot, params, *, prompt=(1,), seed_gen=None, req_id=None):
    output: list[int] = []
    b.add_request(slot, req_id or f"r{slot}", params, list(prompt), output, seed_gen)
    return output


def tokens(out) -> list[int]:
    return out.sampled_token_ids[:, 0].tolist()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- basics --------------------------------------------------------------------------------------


def test_greedy_samples_argmax_for_the_given_slots():
    b = batch()
    add(b, 1, SamplingParams(temperature=0.0))
    add(b, 3, SamplingParams(temperature=0.0))
    out = b.sample(torch.stack([peaked(7), peaked(9)]), [3, 1])
    assert out.sampled_token_ids.shape == (2, 1)
    assert out.sampled_token_ids.dtype == torch.int32
    assert tokens(out) == [7, 9]
    assert out.logprobs_tensors is None


def test_caller_logits_are_not_modified():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0, logit_bias={5: 50.0}))
    logits = peaked(7)[None]
    before = logits.clone()
    b.sample(logits, [0])
    assert torch.equal(logits, before)


def test_empty_call():
    out = batch().sample(torch.zeros(0, VOCAB), [])
    assert out.sampled_token_ids.shape == (0, 1)


# --- seeded requests -----------------------------------------------------------------------------


def seeded_run(neighbour_params, steps=12, my_slot=2, neighbour_slots=(0, 1, 3)):
    torch.manual_seed(0)
    logits = torch.randn(steps, VOCAB)
    b = batch()
    mine = add(b, my_slot, SamplingParams(temperature=1.0, seed=99), seed_gen=gen(99))
    for slot, params in zip(neighbour_slots, neighbour_params, strict=False):
        gen_ = gen(params.seed) if params.seed is not None else None
        add(b, slot, params, seed_gen=gen_)
    active = [my_slot, *neighbour_slots[: len(neighbour_params)]]
    for step in range(steps):
        rows = torch.stack([logits[step]] + [torch.randn(VOCAB) for _ in active[1:]])
        mine.append(tokens(b.sample(rows, active))[0])
    return mine


def test_seeded_request_is_independent_of_neighbours_and_slot():
    alone = seeded_run([])
    crowded = seeded_run(
        [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.5, seed=3, top_k=5),
            SamplingParams(temperature=1.5, top_p=0.5, min_p=0.1, logit_bias={4: 3.0}),
        ],
        my_slot=1,
        neighbour_slots=(3, 0, 2),
    )
    assert alone == crowded
    assert len(set(alone)) > 3  # it is really sampling


def test_slot_generators_do_not_advance_when_the_slot_does_not_sample():
    torch.manual_seed(1)
    logits = torch.randn(6, VOCAB)

    def run(extra_steps_for_other: int) -> list[int]:
        b = batch()
        add(b, 0, SamplingParams(temperature=1.0, seed=5), seed_gen=gen(5))
        add(b, 1, SamplingParams(temperature=1.0, seed=6), seed_gen=gen(6))
        out = []
        for step in range(6):
            for _ in range(extra_steps_for_other):  # steps where slot 0 is not scheduled
                b.sample(torch.randn(1, VOCAB), [1])
            out.append(tokens(b.sample(logits[step][None], [0]))[0])
        return out

    assert run(0) == run(3)


# --- logits processors (built-in) ----------------------------------------------------------------


def test_min_tokens_suppresses_eos_until_reached():
    b = batch()
    output = add(b, 1, SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[EOS]))
    seen = []
    for _ in range(3):
        token = tokens(b.sample(peaked(EOS, 11)[None], [1]))[0]
        seen.append(token)
        output.append(token)
    assert seen == [11, 11, EOS]


def test_logit_bias_only_hits_its_slot():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0))
    add(b, 2, SamplingParams(temperature=0.0, logit_bias={5: 50.0}))
    logits = torch.stack([peaked(7), peaked(7)])
    assert tokens(b.sample(logits, [0, 2])) == [7, 5]
    assert tokens(b.sample(logits, [2, 0])) == [5, 7]
    assert tokens(b.sample(logits[:1], [2])) == [5]
    assert tokens(b.sample(logits[:1], [0])) == [7]


def test_replaced_slot_drops_old_processor_state():
    b = batch()
    add(b, 1, SamplingParams(temperature=0.0, logit_bias={5: 50.0}), req_id="old")
    assert tokens(b.sample(peaked(7)[None], [1])) == [5]
    b.remove_request(1)
    add(b, 1, SamplingParams(temperature=0.0), req_id="new")  # same step as the removal
    assert tokens(b.sample(peaked(7)[None], [1])) == [7]


def test_min_p_removes_unlikely_tokens():
    torch.manual_seed(2)
    b = batch(num_slots=8)
    for slot in range(8):
        add(b, slot, SamplingParams(temperature=1.0, min_p=0.5))
    probs = torch.full((VOCAB,), 1e-6)
    probs[:4] = torch.tensor([0.4, 0.3, 0.15, 0.15])
    logits = probs.log().expand(8, -1)
    seen = Counter()
    for _ in range(40):
        seen.update(tokens(b.sample(logits, list(range(8)))))
    assert set(seen) == {0, 1}


# --- other sampler features ----------------------------------------------------------------------


class WordTokenizer:
    """Just enough tokenizer for ``SamplingParams.update_from_tokenizer``."""

    ids = {"x": [5], "y z": [7, 8]}
    max_token_id = VOCAB - 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.ids[text.strip()]


def test_bad_words_are_never_sampled():
    params = SamplingParams(temperature=0.0, bad_words=["x", "y z"])
    params.update_from_tokenizer(WordTokenizer())
    b = batch()
    output = add(b, 0, params)
    assert tokens(b.sample(peaked(5, 8, 9)[None], [0])) == [8]
    output.append(7)  # now "y z" would complete with 8
    assert tokens(b.sample(peaked(5, 8, 9)[None], [0])) == [9]


def test_bad_words_need_tokenised_params():
    with pytest.raises(ValueError, match="bad_words_token_ids"):
        add(batch(), 0, SamplingParams(bad_words=["x"]))


def test_allowed_token_ids_restrict_choice():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0))
    add(b, 1, SamplingParams(temperature=0.0, allowed_token_ids=[10, 11]))
    logits = torch.stack([peaked(3, 11, 10), peaked(3, 11, 10)])
    assert tokens(b.sample(logits, [0, 1])) == [3, 11]


def test_penalties_read_the_live_output_list():
    b = batch()
    output = add(b, 0, SamplingParams(temperature=0.0, repetition_penalty=3.0), prompt=[])
    assert tokens(b.sample(peaked(4, 6)[None], [0])) == [4]
    output.append(4)
    assert tokens(b.sample(peaked(4, 6)[None], [0])) == [6]


def test_prompt_counts_for_repetition_penalty():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0, repetition_penalty=3.0), prompt=[4])
    assert tokens(b.sample(peaked(4, 6)[None], [0])) == [6]


def test_grammar_bitmask_restricts_rows_by_request():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0), req_id="free")
    add(b, 1, SamplingParams(temperature=0.0), req_id="json")
    add(b, 2, SamplingParams(temperature=0.0), req_id="idle")
    words = (VOCAB + 31) // 32
    bitmask = np.zeros((2, words), dtype=np.int32)
    bitmask[0, 40 // 32] |= 1 << (40 % 32)  # "json": only token 40 (and 3)
    bitmask[0, 0] |= 1 << 3
    bitmask[1, :] = 0  # "idle" is not sampled now: its row must be ignored
    logits = torch.stack([peaked(9, 40), peaked(9, 40, 3)])
    out = b.sample(logits, [0, 1], bitmask, grammar_req_ids=["json", "idle"])
    assert tokens(out) == [9, 40]
    by_slot = b.sample(logits, [0, 1], bitmask, grammar_req_slots=[1, 2])
    assert tokens(by_slot) == [9, 40]


def test_grammar_bitmask_sign_bit_allows_token_31():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0))
    bitmask = np.zeros((1, 2), dtype=np.int32)
    bitmask[0, 0] = np.int32(-(2**31))  # only bit 31 set
    assert tokens(b.sample(peaked(1, 31)[None], [0], bitmask, [0])) == [31]


def test_grammar_bitmask_rows_must_match_requests():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="bitmask"):
        b.sample(peaked(1)[None], [0], np.zeros((2, 2), dtype=np.int32), [0])


def test_logprobs_shape_and_values():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0, logprobs=3))
    add(b, 1, SamplingParams(temperature=0.0))
    logits = torch.randn(2, VOCAB)
    out = b.sample(logits, [0, 1])
    lp = out.logprobs_tensors
    assert lp.logprob_token_ids.shape == (2, 4)
    assert lp.logprobs.shape == (2, 4)
    assert lp.selected_token_ranks.tolist() == [1, 1]
    expected = logits.log_softmax(-1)
    top = expected.topk(3, dim=-1)
    assert torch.equal(lp.logprob_token_ids[:, 1:].long(), top.indices)
    torch.testing.assert_close(lp.logprobs[:, 1:], top.values)
    torch.testing.assert_close(lp.logprobs[:, 0], expected.max(dim=-1).values)


def test_logprob_token_ids_are_gathered():
    b = batch()
    add(b, 0, SamplingParams(temperature=0.0, logprob_token_ids=[3, 5]))
    logits = torch.randn(1, VOCAB)
    lp = b.sample(logits, [0]).logprobs_tensors
    assert lp.logprob_token_ids[0, 1:].tolist() == [3, 5]
    torch.testing.assert_close(lp.logprobs[0, 1:], logits.log_softmax(-1)[0, [3, 5]])


def test_gathered_logprobs_hold_the_token_then_the_top_n_with_ranks():
    logits = torch.randn(5, VOCAB)
    targets = torch.tensor([3, 1, 4, 1, 5])
    expected = logits.log_softmax(-1)
    lp = gather_logprobs(expected, 2, targets)
    assert lp.logprob_token_ids.shape == (5, 3)
    assert lp.logprob_token_ids[:, 0].tolist() == targets.tolist()
    torch.testing.assert_close(lp.logprobs[:, 0], expected[torch.arange(5), targets])
    torch.testing.assert_close(lp.logprobs[:, 1:], expected.topk(2, dim=-1).values)
    ranks = (expected >= expected[torch.arange(5), targets][:, None]).sum(-1)
    assert torch.equal(lp.selected_token_ranks, ranks)


# --- custom logits processors --------------------------------------------------------------------


class ForceToken(LogitsProcessor):
    """Forces ``extra_args["force"]``; records the batch indices it was told about."""

    seen_indices: list[int] = []

    def __init__(self, vllm_config, device, is_pin_memory):
        self.force: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index, params, _, _ in batch_update.added:
            ForceToken.seen_indices.append(index)
            if params.extra_args and "force" in params.extra_args:
                self.force[index] = params.extra_args["force"]
            else:
                self.force.pop(index, None)
        for index in batch_update.removed:
            self.force.pop(index, None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, token in self.force.items():
            logits[index] = float("-inf")
            logits[index, token] = 0.0
        return logits


def test_custom_processor_is_driven_by_slot():
    ForceToken.seen_indices = []
    b = batch(logits_processors=[ForceToken])
    add(b, 1, SamplingParams(temperature=0.0, extra_args={"force": 21}))
    add(b, 3, SamplingParams(temperature=0.0, extra_args={"force": 33}))
    add(b, 2, SamplingParams(temperature=0.0))
    logits = torch.stack([peaked(7)] * 3)
    assert tokens(b.sample(logits, [3, 2, 1])) == [33, 7, 21]
    assert tokens(b.sample(logits[:1], [1])) == [21]
    assert sorted(ForceToken.seen_indices) == [1, 2, 3]
    b.remove_request(3)
    add(b, 3, SamplingParams(temperature=0.0), req_id="plain")
    assert tokens(b.sample(logits[:2], [3, 1])) == [7, 21]


def test_custom_processors_default_to_model_config():
    b = HostSamplingBatch(4, VOCAB, make_vllm_config(logits_processors=[ForceToken]))
    add(b, 0, SamplingParams(temperature=0.0, extra_args={"force": 12}))
    assert tokens(b.sample(peaked(7)[None], [0])) == [12]


# --- input checks --------------------------------------------------------------------------------


def test_slot_errors():
    b = batch()
    add(b, 0, SamplingParams())
    with pytest.raises(ValueError, match="holds request"):
        add(b, 0, SamplingParams(), req_id="other")
    with pytest.raises(ValueError, match="already sits"):
        add(b, 1, SamplingParams(), req_id="r0")
    with pytest.raises(ValueError, match="outside"):
        add(b, 4, SamplingParams())
    with pytest.raises(ValueError, match="holds no request"):
        b.sample(torch.zeros(1, VOCAB), [1])
    with pytest.raises(ValueError, match="holds no request"):
        b.remove_request(2)


def test_call_errors():
    b = batch()
    add(b, 0, SamplingParams())
    add(b, 1, SamplingParams())
    with pytest.raises(ValueError, match="one row per slot"):
        b.sample(torch.zeros(1, VOCAB), [0, 1])
    with pytest.raises(ValueError, match="columns"):
        b.sample(torch.zeros(1, VOCAB + 1), [0])
    with pytest.raises(ValueError, match="twice"):
        b.sample(torch.zeros(2, VOCAB), [0, 0])


def test_slot_count_bounded_by_max_num_seqs():
    with pytest.raises(ValueError, match="max_num_seqs"):
        HostSamplingBatch(9, VOCAB, make_vllm_config(max_num_seqs=8))


def test_slot_of():
    b = batch()
    add(b, 2, SamplingParams(), req_id="abc")
    assert b.slot_of("abc") == 2
    with pytest.raises(KeyError):
        b.slot_of("nope")


# --- thinking_token_budget: vLLM's budget state over slots ------------------------------------

THINK, END = 60, 61
WORD = 7


def reasoning_batch(num_slots: int = 4) -> HostSamplingBatch:
    config = make_vllm_config()
    # The two properties vLLM's holder reads (``ReasoningConfig`` derives them from the parser).
    config.reasoning_config = SimpleNamespace(reasoning_start_token_ids=[THINK], reasoning_end_token_ids=[END])
    return HostSamplingBatch(num_slots, VOCAB, config)


def run(b: HostSamplingBatch, outputs: dict[int, list[int]], steps: int, call: list[int], top: int = WORD) -> None:
    """``steps`` calls sampling the slots of ``call`` (in that row order) from logits whose best
    token is ``top``, appending each token to its slot's output as the runner does."""
    for _ in range(steps):
        got = tokens(b.sample(torch.stack([peaked(top)] * len(call)), call))
        for slot, token in zip(call, got, strict=True):
            outputs[slot].append(token)


def test_budget_forces_the_end_token_after_n_think_tokens_of_a_prompt_in_think():
    b = reasoning_batch()
    outputs = {2: add(b, 2, SamplingParams(temperature=0.0, thinking_token_budget=3), prompt=(1, THINK))}
    run(b, outputs, 6, [2])
    assert outputs[2] == [WORD, WORD, WORD, END, WORD, WORD]


def test_budget_zero_ends_the_think_section_at_once():
    b = reasoning_batch()
    outputs = {0: add(b, 0, SamplingParams(temperature=0.0, thinking_token_budget=0), prompt=(1, THINK))}
    run(b, outputs, 3, [0])
    assert outputs[0] == [END, WORD, WORD]


def test_a_think_section_the_model_opens_is_counted_from_its_start_token():
    b = reasoning_batch()
    outputs = {1: add(b, 1, SamplingParams(temperature=0.0, thinking_token_budget=2), prompt=(1, 5))}
    run(b, outputs, 1, [1], top=THINK)
    run(b, outputs, 4, [1])
    assert outputs[1] == [THINK, WORD, WORD, END, WORD]


def test_rows_without_a_budget_and_slots_left_out_of_a_call_are_untouched():
    b = reasoning_batch()
    outputs = {
        0: add(b, 0, SamplingParams(temperature=0.0), prompt=(1, THINK)),
        3: add(b, 3, SamplingParams(temperature=0.0, thinking_token_budget=2), prompt=(1, THINK)),
    }
    run(b, outputs, 1, [3, 0])  # rows in another order than slots
    run(b, outputs, 1, [0])  # slot 3 does not sample: its count must not move
    run(b, outputs, 3, [3, 0])
    assert outputs[0] == [WORD] * 5
    assert outputs[3] == [WORD, WORD, END, WORD]


def test_a_replaced_slot_starts_from_its_new_request():
    b = reasoning_batch()
    outputs = {1: add(b, 1, SamplingParams(temperature=0.0, thinking_token_budget=1), prompt=(1, THINK))}
    run(b, outputs, 2, [1])
    assert outputs[1] == [WORD, END]
    b.remove_request(1)
    outputs = {1: add(b, 1, SamplingParams(temperature=0.0), prompt=(1, THINK), req_id="next")}
    run(b, outputs, 3, [1])
    assert outputs[1] == [WORD] * 3


def test_without_reasoning_config_there_is_no_budget_state():
    b = HostSamplingBatch(2, VOCAB, make_vllm_config())
    add(b, 0, SamplingParams(temperature=0.0), prompt=(1, THINK))
    assert b.metadata([0]).thinking_budget_state_holder is None
