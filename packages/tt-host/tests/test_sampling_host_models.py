"""Host models serve prompt logprobs: ``prefill_forward(return_all_logits=True)`` returns every
computed position's logits, right-aligned, equal to transformers' logits, chunk by chunk."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.families import HostQwen3ForCausalLM
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_models_registry.contract import ModelCapabilities
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_sampling.params import TTSamplingParams

BLOCK = 16
WIDTH = 8


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    config = AutoConfig.from_pretrained(tiny_checkpoint("qwen3"))
    return HostQwen3ForCausalLM.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), 4, WIDTH * BLOCK)


def kv_cache(model):
    cfg = model.config
    return model.allocate_kv_cache((32, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)


def prefill(model, kv, prompts, starts, ends, **kwargs):
    """One prefill call; row i uses blocks ``1 + 4i ..`` and computes ``[starts[i], ends[i])``."""
    tokens = torch.zeros(len(prompts), max(ends), dtype=torch.int32)
    table = torch.zeros(len(prompts), WIDTH, dtype=torch.int32)
    for i, prompt in enumerate(prompts):
        tokens[i, : ends[i]] = torch.tensor(prompt[: ends[i]])
        table[i, :4] = torch.arange(1 + 4 * i, 5 + 4 * i)
    return model.prefill_forward(tokens=tokens, page_table=table, kv_cache=kv, prompt_lens=ends,
                                 start_pos=starts, empty_slots=list(range(len(prompts))), **kwargs)


def test_host_models_declare_prompt_logprobs():
    assert ModelCapabilities.of(HostQwen3ForCausalLM).supports_prompt_logprobs


def test_all_logits_match_transformers_over_chunks(model, hf_reference):
    hf = hf_reference("qwen3")
    prompts = [[(7 * i + 3) % 900 + 5 for i in range(30)], [(11 * i + 1) % 900 + 5 for i in range(9)]]
    with torch.no_grad():
        expected = [hf(torch.tensor([p])).logits[0] for p in prompts]
    kv = kv_cache(model)
    first = prefill(model, kv, prompts, [0, 0], [12, 9], return_all_logits=True)
    second = prefill(model, kv, prompts[:1], [12], [30], return_all_logits=True)
    assert first.shape == (2, 12, model.config.vocab_size) and second.shape == (1, 18, model.config.vocab_size)
    torch.testing.assert_close(first[0], expected[0][:12], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first[1, 3:], expected[1], atol=1e-4, rtol=1e-4)  # right-aligned
    torch.testing.assert_close(second[0], expected[0][12:30], atol=1e-4, rtol=1e-4)


def test_last_column_is_the_plain_prefill_output(model):
    prompts = [[5, 9, 33, 71, 2, 14], [8, 8, 40]]
    every = prefill(model, kv_cache(model), prompts, [0, 0], [6, 3], return_all_logits=True)
    last = prefill(model, kv_cache(model), prompts, [0, 0], [6, 3])
    torch.testing.assert_close(every[:, -1], last[:, -1])


def test_all_logits_cannot_be_sampled(model):
    with pytest.raises(HostModelInputError, match="return_all_logits"):
        prefill(model, kv_cache(model), [[5, 6, 7]], [0], [3], return_all_logits=True,
                sampling_params=TTSamplingParams.neutral(1))
