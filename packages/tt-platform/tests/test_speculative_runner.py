"""The runner's side of speculative decoding: a step carrying drafts is a decode step (rows are
classified by computed tokens, not by how many tokens they were scheduled), its inputs are the
fixed ``[num_slots, 1 + K]`` verify shape, and vLLM's placeholders are not drafts."""

from __future__ import annotations

import pytest
from vllm_tt_platform.runner.batch import PersistentBatch
from vllm_tt_platform.runner.speculative import real_drafts
from vllm_tt_platform.runner.step import DecodeInputs, StepPlan, VerifyInputs
from vllm_tt_scheduler.phase import MixedStepError, Phase
from vllm_tt_testing.scheduler_outputs import cached_requests as cached
from vllm_tt_testing.scheduler_outputs import new_request as new
from vllm_tt_testing.scheduler_outputs import scheduler_output as step

K = 3


def _decoding_batch() -> PersistentBatch:
    batch = PersistentBatch(lanes=1, rows_per_lane=4)
    batch.update(step([new("a", [1, 2, 3], [1]), new("b", [4, 5], [2])], scheduled={"a": 3, "b": 2}))
    batch.requests["a"].output_token_ids.append(40)
    batch.requests["b"].output_token_ids.append(50)
    return batch


def test_a_step_with_drafts_is_a_decode_step_of_the_verify_shape():
    batch = _decoding_batch()
    out = step(cached=cached(["a", "b"], [3, 2]), scheduled={"a": 1 + K, "b": 1})
    out.scheduled_spec_decode_tokens = {"a": [7, 8, 9], "b": [-1, -1, -1]}  # b: vLLM's placeholders
    batch.update(out)
    plan = StepPlan.build(out, batch)
    assert plan.phase is Phase.DECODE
    drafts = real_drafts(out)
    assert drafts == {"a": [7, 8, 9]}
    decode = DecodeInputs.build(plan.rows, num_slots=4, table_width=3, blocks_per_lane=100)
    inputs = VerifyInputs.build(decode, plan.rows, drafts, K)
    assert inputs.tokens.tolist() == [[40, 7, 8, 9], [50, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert inputs.num_valid.tolist() == [4, 1, 0, 0]
    assert decode.start_pos.tolist() == [3, 2, -1, -1]


def test_partial_placeholders_end_a_rows_drafts():
    out = step(scheduled={"a": 4})
    out.scheduled_spec_decode_tokens = {"a": [5, -1, 6]}  # a grammar-invalid draft padded with -1
    assert real_drafts(out) == {"a": [5]}


def test_a_row_resumed_onto_its_cached_prefix_prefills_without_its_placeholders():
    """After a preemption vLLM resumes a row whose KV is still cached up to its last token as one
    real token plus K placeholders: a prefill row of that one token, which samples the next."""
    from vllm_tt_platform.runner.step import PrefillInputs

    batch = _decoding_batch()
    batch.update(step(preempted=["a"]))
    out = step(cached=cached(["a"], [3], new_blocks=[([1],)], resumed={"a"}, all_tokens={"a": [1, 2, 3, 40]}),
               scheduled={"a": 1 + K})
    out.scheduled_spec_decode_tokens = {"a": [-1] * K}
    batch.update(out)
    plan = StepPlan.build(out, batch)
    assert plan.phase is Phase.PREFILL and not real_drafts(out)
    (row,) = plan.rows
    assert (row.num_scheduled, row.end, row.produces_token) == (1, 4, True)
    inputs = PrefillInputs.build(plan.rows, table_width=3, blocks_per_lane=100)
    assert inputs.tokens.tolist() == [[1, 2, 3, 40]]
    assert (inputs.start_pos.tolist(), inputs.prompt_lens.tolist()) == ([3], [4])


def test_drafts_do_not_hide_a_mixed_step():
    batch = _decoding_batch()
    out = step([new("c", [6, 7, 8], [3])], cached(["a"], [3]), scheduled={"a": 1 + K, "c": 3})
    out.scheduled_spec_decode_tokens = {"a": [7, 8, 9]}
    batch.update(out)
    with pytest.raises(MixedStepError):
        StepPlan.build(out, batch)


def _spec_config(uses_mrope: bool = False):
    from types import SimpleNamespace

    return SimpleNamespace(speculative_config=SimpleNamespace(method="ngram", num_speculative_tokens=K),
                           model_config=SimpleNamespace(uses_mrope=uses_mrope))


def test_speculation_is_refused_where_verify_steps_cannot_run():
    """A model without verify steps is refused; an mRoPE model that declares them is served
    (its verify steps carry the rope deltas: test_an_mrope_verify_step_carries_every_slots_rope_delta)."""
    from vllm_tt_models_registry.contract import ModelCapabilities
    from vllm_tt_platform.config.startup_checks import check_speculation
    from vllm_tt_platform.errors import TTUnsupportedFeatureError

    with pytest.raises(TTUnsupportedFeatureError, match="supports_verify_decode") as info:
        check_speculation(_spec_config(True), ModelCapabilities(), "TTExample")
    assert "--speculative-config" in str(info.value)
    check_speculation(_spec_config(), ModelCapabilities(supports_verify_decode=True), "TTExample")
    check_speculation(_spec_config(True), ModelCapabilities(supports_verify_decode=True), "TTExample")


def test_a_drafter_model_on_a_recurrent_state_target_is_refused_naming_the_method():
    from types import SimpleNamespace

    from vllm_tt_models_registry.contract import ModelCapabilities
    from vllm_tt_platform.config.startup_checks import check_speculation
    from vllm_tt_platform.errors import TTUnsupportedFeatureError

    config = SimpleNamespace(speculative_config=SimpleNamespace(method="draft_model", num_speculative_tokens=K),
                             model_config=SimpleNamespace(uses_mrope=False))
    hybrid = ModelCapabilities(supports_verify_decode=True, kv_cache_kinds=("full_attention", "recurrent_state"))
    with pytest.raises(TTUnsupportedFeatureError, match=r"--speculative-config method.*draft_model.*ngram or mtp"):
        check_speculation(config, hybrid, "TTExample")
    check_speculation(_spec_config(), hybrid, "TTExample")  # ngram runs


def test_an_mrope_verify_step_carries_every_slots_rope_delta():
    """As a decode step does: slot order, 0 for free slots; a text model's calls carry none."""
    from vllm_tt_models_registry.contract import ROPE_DELTAS_KWARG
    from vllm_tt_platform.runner.call_builder import StepCalls

    batch = _decoding_batch()
    out = step(cached=cached(["a", "b"], [3, 2]), scheduled={"a": 1 + K, "b": 1})
    out.scheduled_spec_decode_tokens = {"a": [7, 8, 9]}
    batch.update(out)
    batch.requests["b"].rope_delta = -5
    plan = StepPlan.build(out, batch)
    for mrope, expected in ((True, [0, -5, 0, 0]), (False, None)):
        calls = StepCalls(kv_cache=None, table_width=3, blocks_per_lane=100, layout=None, num_slots=4, vocab_size=64,
                          prefill_trace=False, decode_trace=False, uses_mrope=mrope)
        kwargs = calls.verify(plan, None, real_drafts(out), K).to_contract_kwargs()
        assert kwargs.get(ROPE_DELTAS_KWARG) == expected
        assert kwargs["num_valid_tokens"].tolist() == [4, 1, 0, 0]


def test_a_recurrent_group_keeps_one_state_slot_per_verify_position():
    """``1 + K`` state blocks per request (vLLM's ``num_speculative_blocks``), a ring by
    position: a step reads the slot of its first position's predecessor and writes position
    ``start + j``'s state to slot ``(start + j) % (1 + K)``, so after a partial accept the next
    step reads the state of the last kept position."""
    from vllm_tt_platform.runner.kv_layout import KVGroup

    ring = KVGroup(0, (0,), 256, None, recurrent=True, state_slots=1 + K)
    ids = [11, 12, 13, 14]
    assert ring.state_blocks(ids, 0, 5) == (11, 11, 12, 13, 14)  # a prefill from 0: the state after 4
    assert ring.state_blocks(ids, 6, 7) == (12, 13, 14, 11, 12)  # verify at 6: positions 6..9
    assert ring.state_blocks(ids, 8, 9) == (14, 11, 12, 13, 14)  # 2 of 3 drafts kept: reads position 7's
    plain = KVGroup(0, (0,), 256, None, recurrent=True)
    assert plain.state_blocks([11], 6, 7) == (11, 11)
    from types import SimpleNamespace

    from vllm_tt_platform.runner.step import page_table

    state = SimpleNamespace(blocks=[ids], num_computed_tokens=6)  # a short max_model_len: 2 blocks a row
    assert page_table([state, None], 2, 100, ring).tolist() == [[12, 13, 14, 11, 12], [0] * 5]


def test_startup_summary_names_the_verify_trace_shape_per_lane():
    from vllm_tt_platform.runner.speculative import SpecSettings

    settings = SpecSettings("ngram", 3)
    assert settings.describe(1, 4, False) == "ngram, K=3, verify trace [4 rows, 4], verified on the host"
    assert settings.describe(4, 8, True) == (
        "ngram, K=3, verify trace [8 rows, 4] per lane x 4 lanes, verified on device when every row is greedy "
        "(argmax ids read back), else on the host"
    )



@pytest.mark.parametrize(("user", "expected"), [(None, "1"), ("2", "2")])
def test_the_ngram_proposer_gets_one_numba_thread_unless_the_user_chose(monkeypatch, user, expected):
    """Set before numba is imported (it reads the count then), as in a fresh engine core."""
    import os
    import sys

    from vllm_tt_platform.runner.drafters import NUMBA_THREADS, one_numba_thread

    monkeypatch.delitem(sys.modules, "numba", raising=False)
    monkeypatch.delenv(NUMBA_THREADS, raising=False)
    if user:
        monkeypatch.setenv(NUMBA_THREADS, user)
    one_numba_thread()
    assert os.environ[NUMBA_THREADS] == expected


def test_a_numba_already_imported_keeps_its_pool(monkeypatch):
    import os
    import sys
    import types

    from vllm_tt_platform.runner.drafters import NUMBA_THREADS, one_numba_thread

    monkeypatch.setitem(sys.modules, "numba", types.ModuleType("numba"))
    monkeypatch.delenv(NUMBA_THREADS, raising=False)
    one_numba_thread()
    assert NUMBA_THREADS not in os.environ  # too late to matter: left as it is


def test_a_row_whose_drafts_keep_missing_drafts_less():
    """Step table of ``DraftBackoff`` at K=3: (drafts kept by the verify step before, drafts the
    row gets now)."""
    from vllm_tt_platform.runner.drafters import DraftBackoff

    backoff = DraftBackoff()
    table = [  # accepted in the step before (None: no verify step, the row decoded plainly)
        (None, 3), (1, 3), (0, 3), (0, 1), (0, 1),  # a second miss in a row: 1-token probes
        (0, 0), (None, 0), (None, 1),  # a fourth: skip 2 steps
        (0, 0), (None, 0), (None, 0), (None, 0), (None, 1),  # a fifth: skip 4
        (1, 3), (0, 3),  # an accepted draft brings K back
    ]
    for step_no, (accepted, drafts) in enumerate(table):
        if accepted is not None:
            backoff.verified("a", 3, accepted)
        assert backoff.drafts_for("a", 3) == drafts, step_no
    backoff.forget(["a"])
    assert backoff.drafts_for("a", 3) == 3


@pytest.mark.parametrize(("tokens", "valid"), [
    ([1, 2, 3, 7, 8], 5),  # both fed drafts were accepted: only the target's next token is new
    ([1, 2, 3, 7, 9, 4], 4),  # the second draft was rejected: its KV is stale from there
    ([1, 2, 3, 5], 3),  # the first draft was rejected
    ([1, 2, 3], 3),
])
def test_the_drafter_rereads_only_what_its_kv_lacks(tokens, valid):
    """After drafting [7, 8, x] for a row of 3 tokens, the drafter's KV holds the 3 tokens and
    the 2 drafts it fed itself; what stands is the prefix the row's tokens still agree with."""
    from vllm_tt_platform.runner.draft_model import SeenTokens

    assert SeenTokens(confirmed=3, drafts=[7, 8]).valid(tokens) == valid


def test_a_hybrid_models_mtp_pages_follow_its_first_attention_group():
    """vLLM may order Qwen 3.5's recurrent groups first; the MTP module's pages (one per target
    block) follow the attention group's table, not a state ring."""
    from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout

    groups = (KVGroup(0, (0,), 256, None, recurrent=True, state_slots=1 + K), KVGroup(1, (1,), 32, None))
    assert KVLayout(groups, ()).attention_group is groups[1]
