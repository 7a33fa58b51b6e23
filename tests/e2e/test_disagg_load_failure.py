"""A prompt whose stored KV went bad between the prefill and the decode engine (a layer's file
gone from its folder) fails that request alone, with finish reason ``error`` (vLLM's
``kv_load_failure_policy: fail``); the request decoded beside it still equals transformers."""

from __future__ import annotations

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import hf_greedy, offline_greedy, offline_llm, seeded_prompts

pytestmark = pytest.mark.e2e

MAX_NEW_TOKENS = 8


def _engine(model_dir, role: str, storage) -> object:
    kv = {"kv_connector": "ExampleConnector", "kv_role": role,
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    return offline_llm(model=str(model_dir), max_model_len=512, max_num_seqs=2, seed=0, kv_transfer_config=kv,
                       enable_chunked_prefill=role == "kv_consumer", additional_config={"tt": {"mesh_backend": "host"}})


def test_a_folder_missing_a_layer_fails_its_request_only(tmp_path):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir = cached_tiny("llama", 200)
    intact, broken = seeded_prompts(13, (300, 150))
    producer = _engine(model_dir, "kv_producer", tmp_path)
    offline_greedy(producer, [broken], 1)
    [folder] = list(tmp_path.iterdir())
    offline_greedy(producer, [intact], 1)
    del producer
    (folder / "model.layers.1.self_attn.safetensors").unlink()
    consumer = _engine(model_dir, "kv_consumer", tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    outs = consumer.generate([TokensPrompt(prompt_token_ids=p) for p in (intact, broken)], params, use_tqdm=False)
    del consumer
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error"]
    assert list(outs[0].outputs[0].token_ids) == hf_greedy(model_dir, [intact], MAX_NEW_TOKENS)[0]
    assert outs[0].num_cached_tokens == 256  # the intact prompt was loaded, not recomputed
