"""Every rule of the per-batch device/host choice, each pinned to its reason code."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm import SamplingParams
from vllm_tt_sampling.decision import (
    REASONS,
    DeviceSamplingCaps,
    DeviceSamplingMode,
    RowSampling,
    SamplingPath,
    choose_sampling_path,
)

CAPS = DeviceSamplingCaps(max_top_k=32, penalties=True, max_logprobs=0)


def row(**overrides) -> RowSampling:
    """A request the device can serve: temperature sampling with top-k 10."""
    return dataclasses.replace(
        RowSampling(greedy=False, top_k=10, penalties=False, logprobs=None), **overrides
    )


def choose(rows, *, mode=DeviceSamplingMode.ALL, prefill=False, caps=CAPS, always_compat=False):
    return choose_sampling_path(rows, mode=mode, prefill=prefill, caps=caps, always_compat=always_compat)


def test_supported_batch_samples_on_device():
    decision = choose([row(), row(greedy=True, top_k=0), row(top_k=32)])
    assert (decision.path, decision.reason) == (SamplingPath.DEVICE, "device")


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"mode": None}, "mode_off"),
        ({"always_compat": True}, "always_compat"),
        ({"mode": DeviceSamplingMode.DECODE_ONLY, "prefill": True}, "phase_not_enabled"),
    ],
)
def test_batch_level_rules(kwargs, reason):
    decision = choose([row()], **kwargs)
    assert (decision.path, decision.reason) == (SamplingPath.HOST, reason)


def test_decode_only_mode_allows_decode():
    assert choose([row()], mode=DeviceSamplingMode.DECODE_ONLY).path is SamplingPath.DEVICE


def test_all_mode_allows_prefill():
    assert choose([row()], prefill=True).path is SamplingPath.DEVICE


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"allowed_token_ids": True}, "allowed_token_ids"),
        ({"bad_words": True}, "bad_words"),
        ({"min_p": True}, "min_p"),
        ({"logit_bias": True}, "logit_bias"),
        ({"min_tokens": True}, "min_tokens"),
        ({"logits_processors": True}, "logits_processors"),
        ({"thinking_budget": True}, "thinking_budget"),
        ({"structured_output": True}, "structured_output"),
        ({"intermediate_chunk": True}, "intermediate_chunk"),
        ({"logprobs": 1}, "logprobs_exceed_device"),
        ({"logprobs": -1}, "logprobs_exceed_device"),
        ({"logprob_token_ids": True}, "logprobs_exceed_device"),
        ({"top_k": 33}, "top_k_exceeds_device"),
        ({"top_k": 0}, "top_k_exceeds_device"),
        ({"top_k": -1}, "top_k_exceeds_device"),
    ],
)
def test_one_row_sends_whole_batch_to_host(overrides, reason):
    decision = choose([row(), row(**overrides), row(greedy=True)])
    assert (decision.path, decision.reason) == (SamplingPath.HOST, reason)


def test_prompt_logprobs_only_matter_in_prefill():
    assert choose([row(prompt_logprobs=True)], prefill=True).reason == "prompt_logprobs"
    assert choose([row(prompt_logprobs=True)], prefill=False).reason == "device"


def test_greedy_rows_ignore_top_k():
    # Disabled top-k with temperature 0 is plain argmax, which the device does.
    assert choose([row(greedy=True, top_k=0), row(greedy=True, top_k=1000)]).reason == "device"


def test_top_k_limit_comes_from_caps():
    caps = DeviceSamplingCaps(max_top_k=8, penalties=True, max_logprobs=0)
    assert choose([row(top_k=8)], caps=caps).reason == "device"
    assert choose([row(top_k=9)], caps=caps).reason == "top_k_exceeds_device"


def test_penalties_follow_caps():
    assert choose([row(penalties=True)]).reason == "device"
    caps = DeviceSamplingCaps(max_top_k=32, penalties=False, max_logprobs=0)
    assert choose([row(penalties=True)], caps=caps).reason == "penalties_unsupported"


def test_logprobs_follow_caps():
    assert choose([row(logprobs=0)]).reason == "device"
    top5 = DeviceSamplingCaps(max_top_k=32, penalties=True, max_logprobs=5)
    assert choose([row(logprobs=5)], caps=top5).reason == "device"
    assert choose([row(logprobs=6)], caps=top5).reason == "logprobs_exceed_device"
    none = DeviceSamplingCaps(max_top_k=32, penalties=True, max_logprobs=-1)
    assert choose([row(logprobs=0)], caps=none).reason == "logprobs_exceed_device"


def test_reason_does_not_depend_on_row_order():
    rows = [row(min_p=True), row(structured_output=True)]
    assert choose(rows).reason == choose(rows[::-1]).reason == "structured_output"


def test_empty_batch_is_device():
    assert choose([]).reason == "device"


@pytest.mark.parametrize("bad", ["prefill", "decode", 1, None])
def test_prefill_must_be_a_bool(bad):
    # A phase name in place of the flag would be truthy, so "decode" would read as prefill.
    with pytest.raises(TypeError, match=f"prefill={bad!r} must be a bool"):
        choose([row()], prefill=bad)


def test_reason_codes_are_listed():
    assert set(REASONS) >= set(
        [
            "mode_off",
            "always_compat",
            "phase_not_enabled",
            "allowed_token_ids",
            "bad_words",
            "min_p",
            "logit_bias",
            "min_tokens",
            "logits_processors",
            "structured_output",
            "logprobs_exceed_device",
            "prompt_logprobs",
            "top_k_exceeds_device",
            "penalties_unsupported",
            "intermediate_chunk",
            "device",
        ]
    )


# --- RowSampling.from_vllm ---------------------------------------------------------------------


def view(params: SamplingParams, **kwargs) -> RowSampling:
    kwargs.setdefault("structured_output", False)
    kwargs.setdefault("intermediate_chunk", False)
    return RowSampling.from_vllm(params, **kwargs)


def test_from_vllm_defaults_are_plain_sampling():
    r = view(SamplingParams())
    assert r == RowSampling(greedy=False, top_k=0, penalties=False, logprobs=None)


@pytest.mark.parametrize(
    ("params", "field", "value"),
    [
        (SamplingParams(temperature=0.0), "greedy", True),
        (SamplingParams(top_k=7), "top_k", 7),
        (SamplingParams(presence_penalty=0.5), "penalties", True),
        (SamplingParams(frequency_penalty=0.5), "penalties", True),
        (SamplingParams(repetition_penalty=1.1), "penalties", True),
        (SamplingParams(logprobs=3), "logprobs", 3),
        (SamplingParams(logprob_token_ids=[1, 2]), "logprob_token_ids", True),
        (SamplingParams(prompt_logprobs=0), "prompt_logprobs", True),
        (SamplingParams(allowed_token_ids=[1]), "allowed_token_ids", True),
        (SamplingParams(bad_words=["x"]), "bad_words", True),
        (SamplingParams(min_p=0.1), "min_p", True),
        (SamplingParams(logit_bias={1: 2.0}), "logit_bias", True),
        (SamplingParams(min_tokens=2), "min_tokens", True),
        (SamplingParams(extra_args={"my_proc": 1}), "logits_processors", True),
        (SamplingParams(thinking_token_budget=8), "thinking_budget", True),
    ],
)
def test_from_vllm_reads_each_feature(params, field, value):
    assert getattr(view(params), field) == value


def test_from_vllm_runner_facts():
    params = SamplingParams()
    assert view(params, structured_output=True).structured_output
    assert view(params, intermediate_chunk=True).intermediate_chunk
    assert view(params, logits_processors_configured=True).logits_processors


def test_min_tokens_stop_counting_once_met():
    params = SamplingParams(min_tokens=3)
    assert view(params, num_output_tokens=2).min_tokens
    assert not view(params, num_output_tokens=3).min_tokens


def test_structured_outputs_in_params_count():
    from vllm.sampling_params import StructuredOutputsParams

    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+"))
    assert view(params).structured_output


# --- caps ------------------------------------------------------------------------------------------


def test_caps_defaults_follow_tt_metal():
    assert DeviceSamplingCaps() == DeviceSamplingCaps(max_top_k=32, penalties=True, max_logprobs=0)


# --- batch composition (property) ----------------------------------------------------------------

rows_strategy = st.builds(
    RowSampling,
    greedy=st.booleans(),
    top_k=st.integers(-1, 40),
    penalties=st.booleans(),
    logprobs=st.one_of(st.none(), st.integers(-1, 3)),
    # Every on/off feature flag of a row.
    **{f.name: st.booleans() for f in dataclasses.fields(RowSampling) if f.default is False},
)


@settings(deadline=None)  # pure logic: a loaded CI machine's scheduling is not the property under test
@given(rows=st.lists(rows_strategy, max_size=6), prefill=st.booleans())
def test_batch_is_device_iff_every_row_alone_is(rows, prefill):
    caps = DeviceSamplingCaps(max_top_k=32, penalties=False, max_logprobs=0)
    decision = choose(rows, prefill=prefill, caps=caps)
    alone = [choose([r], prefill=prefill, caps=caps) for r in rows]
    assert decision.reason in REASONS
    assert (decision.path is SamplingPath.DEVICE) == all(d.path is SamplingPath.DEVICE for d in alone)
    if decision.path is SamplingPath.HOST:
        assert decision.reason in {d.reason for d in alone}


def test_a_greedy_verify_step_is_verified_on_device():
    decision = choose_sampling_path([row(greedy=True, top_k=0)] * 3, mode=DeviceSamplingMode.DECODE_ONLY,
                                    prefill=False, caps=CAPS, always_compat=False, verify=True)
    assert (decision.path, decision.reason) == (SamplingPath.DEVICE, "verify")


@pytest.mark.parametrize(
    ("rows", "kwargs", "reason"),
    [
        # one sampled row (even one the device could sample alone) needs the rejection sampler
        ([row(greedy=True), row(top_k=10)], {}, "verify_sampled"),
        ([row(greedy=True)], {"mode": None}, "mode_off"),
        ([row(greedy=True)], {"always_compat": True}, "always_compat"),
    ],
)
def test_a_verify_step_falls_back_to_the_host(rows, kwargs, reason):
    decision = choose_sampling_path(rows, **{"mode": DeviceSamplingMode.ALL, "prefill": False, "caps": CAPS,
                                             "always_compat": False, **kwargs}, verify=True)
    assert (decision.path, decision.reason) == (SamplingPath.HOST, reason)
    assert reason in REASONS


def test_a_mixed_step_is_sampled_on_the_host():
    """A mixed step (decode rows and a prompt chunk in one program) returns logits."""
    rows = [row(greedy=True, top_k=0)] * 3
    decision = choose_sampling_path(rows, mode=DeviceSamplingMode.ALL, prefill=False, caps=CAPS,
                                    always_compat=False, mixed=True)
    assert (decision.path, decision.reason) == (SamplingPath.HOST, "mixed") and "mixed" in REASONS
    plain = choose_sampling_path(rows, mode=DeviceSamplingMode.ALL, prefill=False, caps=CAPS, always_compat=False)
    assert plain.path is SamplingPath.DEVICE
