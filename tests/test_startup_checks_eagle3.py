"""``--speculative-config method eagle3`` at startup: served on a Llama target with a head made
for it (the head's target layers read as vLLM reads them), and refused before the model loads,
naming the setting and the fix, for a model class without ``supports_eagle3``, a head over
another hidden size or vocabulary, a head naming target layers the model lacks, a head of more
than one layer, and K beyond the verify trace."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

HOST = {"tt": {"mesh_backend": "host"}}


@pytest.fixture(scope="module")
def checkpoints():
    from vllm_tt_testing.checkpoints import cached_eagle3

    return cached_eagle3()


def _config(target, head, k=3):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(target), max_model_len=256, additional_config=HOST,
                      speculative_config={"method": "eagle3", "model": str(head),
                                          "num_speculative_tokens": k}).create_engine_config()


def _edited_head(head, tmp_path, **fields):
    bad = tmp_path / "head"
    shutil.copytree(head, bad)
    config = json.loads((bad / "config.json").read_text())
    for name, value in fields.items():
        if name == "eagle_aux_hidden_state_layer_ids":
            config["eagle_config"][name] = value
        else:
            config[name] = value
    (bad / "config.json").write_text(json.dumps(config))
    return bad


def test_a_head_for_the_llama_target_is_served(checkpoints):
    from vllm_tt_platform.config.eagle3 import Eagle3HeadConfig

    target, head = checkpoints
    served = _config(target, head)
    assert served.speculative_config.method == "eagle3"
    parsed = Eagle3HeadConfig.of(served.speculative_config.draft_model_config, 2)
    assert (parsed.aux_layer_ids, parsed.draft_vocab_size, parsed.num_layers) == ((0, 1, 2), 512, 1)


def test_a_model_without_the_capability_is_refused(checkpoints):
    """The DeepSeek V3 class runs no EAGLE-3 head; nor does a Llama class declaring it not."""
    from vllm_tt_host.models.families import HostLlamaForCausalLM
    from vllm_tt_models_registry.contract import check_model_class
    from vllm_tt_platform.config.startup_checks import check_speculation
    from vllm_tt_testing.checkpoints import cached_mtp

    with pytest.raises(TTUnsupportedFeatureError, match="TTDeepseekV3ForCausalLM, whose model_capabilities do not "
                       "declare supports_eagle3"):
        _config(cached_mtp(), checkpoints[1])
    served = _config(*checkpoints)
    caps = replace(check_model_class(HostLlamaForCausalLM, owner="test"), supports_eagle3=False)
    with pytest.raises(TTUnsupportedFeatureError, match="--speculative-config method") as info:
        check_speculation(served, caps, "TTPlainForCausalLM")
    assert "do not declare supports_eagle3" in str(info.value) and "Fix:" in str(info.value)


@pytest.mark.parametrize(("fields", "says"), [
    ({"target_hidden_size": 64}, "target's hidden size 128"),
    ({"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}, "eagle_aux_hidden_state_layer_ids in [0, 2]"),
    ({"num_hidden_layers": 2}, "a one-layer EAGLE-3 head"),
    ({"draft_vocab_size": 2048}, "the target's vocabulary of 1024 ids"),
], ids=["hidden-size", "layer-ids", "layers", "vocabulary"])
def test_a_head_that_does_not_fit_the_target_is_refused(checkpoints, tmp_path, fields, says):
    target, head = checkpoints
    with pytest.raises(TTConfigError, match="--speculative-config model") as info:
        _config(target, _edited_head(head, tmp_path, **fields))
    assert says in str(info.value) and "Fix:" in str(info.value)


def test_k_beyond_the_verify_trace_is_refused(checkpoints):
    with pytest.raises(TTConfigError, match="--speculative-config num_speculative_tokens") as info:
        _config(*checkpoints, k=8)
    assert "set num_speculative_tokens to 7 or less" in str(info.value)
