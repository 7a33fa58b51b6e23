"""A seeded sample of the flag fuzz (``vllm_tt_testing.flag_fuzz``; the full run is
``nox -s flag-fuzz``): combinations of ``vllm serve`` options vLLM's parser accepts each
configure or fail with a typed error naming one of them, never an untyped one, never a hang."""

from __future__ import annotations

import pytest
from vllm_tt_platform.config.surface import Support
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_testing import flag_fuzz

SAMPLE = 4


@pytest.fixture(autouse=True)
def host_backend(monkeypatch):
    monkeypatch.setenv("TT_MESH_BACKEND", "host")


def test_the_fuzzed_options_are_the_manifests_works_and_refused_ones():
    classes = flag_fuzz.knob_classes()
    assert {dest: c for dest, c in classes.items() if c not in (Support.WORKS, Support.REFUSED)} == {}


def test_served_names_are_read_from_the_arguments():
    assert flag_fuzz.served_names(["--seed", "1", "--served-model-name", "a", "b", "--enforce-eager"]) == ["a", "b"]
    assert flag_fuzz.served_names(["--seed", "1"]) == []


def test_combinations_are_seeded():
    assert list(flag_fuzz.combinations(3, 5)) == list(flag_fuzz.combinations(3, 5))
    assert list(flag_fuzz.combinations(3, 5)) != list(flag_fuzz.combinations(4, 5))


def test_a_seeded_sample_configures_or_is_refused_by_name(tiny_checkpoint):
    outcomes, _ = flag_fuzz.run(tiny_checkpoint("llama"), seed=0, count=SAMPLE)
    assert len(outcomes) == SAMPLE
    assert [(o.args, o.kind, o.detail) for o in outcomes if o.finding] == []
    assert "configured" in {o.kind for o in outcomes}


def test_an_error_naming_no_given_option_or_untyped_is_a_finding():
    named = TTUnsupportedFeatureError("--enable-lora", True, "off", "remove it")
    assert flag_fuzz.classify(named, ("enable_lora",))[0] == "refused by TT"
    assert flag_fuzz.classify(named, ("seed",))[0] == "unnamed error"
    assert flag_fuzz.classify(ValueError("max_num_batched_tokens (64) is smaller"),
                              ("max_num_batched_tokens",))[0] == "refused by vLLM"
    assert flag_fuzz.classify(ValueError("Failed to import Ray"), ("data_parallel_backend",), ("ray",))[0] == \
        "refused by vLLM"
    assert flag_fuzz.classify(ValueError("experts must be > 0 when expert parallelism is enabled"),
                              ("enable_expert_parallel",))[0] == "refused by vLLM"
    assert flag_fuzz.classify(ValueError("something"), ("seed",))[0] == "unnamed error"
    assert flag_fuzz.classify(KeyError("tt"), ("seed",))[0] == "untyped error"


def test_one_build_does_not_leak_into_the_next(tiny_checkpoint):
    model = tiny_checkpoint("llama")
    routed = flag_fuzz.build(model, ("enable_return_routed_experts",), ["--enable-return-routed-experts"])
    assert routed.kind == "refused by TT"
    assert flag_fuzz.build(model, ("seed",), ["--seed", "1"]).kind == "configured"


def test_a_pooling_configuration_pools_with_a_step_budget_for_its_longest_shape(tiny_checkpoint):
    """``--convert embed`` alone pools (a real start of it is sent an embedding request), vLLM's
    default step budget raised to the longest pooling shape; a budget the user gave below it is
    refused naming it."""
    model = tiny_checkpoint("llama")
    pooled = flag_fuzz.build(model, ("convert",), ["--convert", "embed"])
    assert (pooled.kind, pooled.pools) == ("configured", True), pooled.detail
    assert pooled.config.scheduler_config.max_num_batched_tokens == pooled.config.model_config.max_model_len
    assert not flag_fuzz.build(model, ("seed",), ["--seed", "1"]).pools
    given = flag_fuzz.build(model, ("runner", "max_num_batched_tokens"),
                            ["--runner", "pooling", "--max-num-batched-tokens", "512"])
    assert given.kind == "refused by TT" and "--max-num-batched-tokens" in given.detail, given.detail


def test_a_build_past_its_time_limit_is_a_hang(tiny_checkpoint, monkeypatch):
    import time

    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setattr(EngineArgs, "create_engine_config", lambda self, **kw: time.sleep(5))
    outcome = flag_fuzz.build(tiny_checkpoint("llama"), ("seed",), ["--seed", "1"], timeout_s=0.2)
    assert outcome.kind == "hang" and outcome.finding
