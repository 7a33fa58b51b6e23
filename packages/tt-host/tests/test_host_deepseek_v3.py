"""The host DeepSeek V3 against transformers' ``DeepseekV3ForCausalLM``: the routing and YaRN
pieces against transformers' own modules, then the whole model through the TT contract the
way the runner drives an MLA model: one latent tensor per layer (K and V are the same cache),
one block table for every layer, blocks handed out in shuffled order from a pool whose unused
blocks (and the null block 0) hold garbage, chunked prefill, paged decode, lanes. Mistakes in
the routing or the rope split must move the outputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_modeling
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.deepseek_v3 import moe as ds_moe
from vllm_tt_host.models.deepseek_v3.config import DeepseekV3Config
from vllm_tt_host.models.deepseek_v3.model import HostDeepseekV3ForCausalLM
from vllm_tt_host.models.deepseek_v3.moe import RoutedExperts, route, routed_moe
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.checkpoints import cached_tiny
from vllm_tt_testing.contract_driver import ContractDriver
from vllm_tt_testing.parity import assert_matches_hf, prompts

BLOCK = 16
NUM_BLOCKS = 40
WIDTH = 10
"""Page-table width (blocks per row): 160 positions."""
TRAIN_STEPS = 120
"""Shared with tests/e2e/test_deepseek_v3_serve.py (same recipe, one build per session)."""


@pytest.fixture(scope="session")
def deepseek_dir() -> Path:
    return cached_tiny("deepseek_v3", TRAIN_STEPS)


@pytest.fixture(scope="session")
def hf_deepseek(deepseek_dir: Path):
    return AutoModelForCausalLM.from_pretrained(deepseek_dir, dtype=torch.float32).eval()


def build(folder: Path, batch: int = 2, lanes: int = 1, mesh: MeshShape | None = None) -> HostDeepseekV3ForCausalLM:
    model = HostDeepseekV3ForCausalLM.initialize_vllm_model(
        AutoConfig.from_pretrained(folder), HostMeshDevice(mesh or MeshShape(lanes, 1)), batch, WIDTH * BLOCK,
        tt_data_parallel=lanes,
    )
    assert isinstance(model, HostDeepseekV3ForCausalLM)
    return model


# ---- the pieces against transformers' modules --------------------------------------------


def test_routing_and_experts_match_transformers(deepseek_dir, hf_deepseek):
    model = build(deepseek_dir)
    config, experts = model.config, model.decoder.weights.layers[1].mlp
    assert isinstance(config, DeepseekV3Config) and isinstance(experts, RoutedExperts)
    assert experts.correction_bias.abs().max() > 0  # the tiny recipe seeds it
    x = torch.randn(256, config.hidden_size, generator=torch.Generator().manual_seed(1))
    hf_moe = hf_deepseek.model.layers[1].mlp
    with torch.no_grad():
        _, hf_weights, hf_experts = hf_moe.gate(x)
        theirs = hf_moe(x[None])[0]
    ours_experts, ours_weights = route(x, experts, config.experts)
    order, hf_order = ours_experts.argsort(-1), hf_experts.argsort(-1)
    assert torch.equal(ours_experts.gather(1, order), hf_experts.gather(1, hf_order))
    torch.testing.assert_close(ours_weights.gather(1, order), hf_weights.gather(1, hf_order))
    torch.testing.assert_close(routed_moe(x, experts, config.experts), theirs, atol=1e-5, rtol=1e-5)
    # Every chosen expert lies in one of topk_group groups, and the group limit binds.
    groups = ours_experts // (config.experts.num_experts // config.experts.n_group)
    assert all(len(set(row)) <= config.experts.topk_group for row in groups.tolist())
    scores = torch.nn.functional.linear(x, experts.router).sigmoid()
    assert (scores.topk(2, -1).indices.sort(-1).values != ours_experts.sort(-1).values).any()
    assert ours_weights.sum(-1).allclose(torch.tensor(config.experts.routed_scaling_factor))


def test_yarn_rope_and_softmax_scale_match_transformers(deepseek_dir, hf_deepseek):
    model = build(deepseek_dir)
    config, decoder = model.config, model.decoder
    assert isinstance(config, DeepseekV3Config) and config.rope.yarn is not None
    hf_attention = hf_deepseek.model.layers[0].self_attn
    assert config.softmax_scale == pytest.approx(hf_attention.scaling, rel=1e-12)
    assert config.softmax_scale != pytest.approx(config.mla.qk_head_dim**-0.5)  # the correction is there
    rotary = hf_deepseek.model.rotary_emb
    ours = decoder.rotaries[0]
    assert torch.equal(ours.inv_freq, rotary.inv_freq) and ours.scale == pytest.approx(rotary.attention_scaling)
    assert rotary.attention_scaling != 1.0  # mscale differs from mscale_all_dim
    x, positions = torch.randn(7, 4, config.mla.qk_rope_head_dim), torch.arange(100, 107)
    cos, sin = rotary(x, positions[None])
    theirs, _ = hf_modeling.apply_rotary_pos_emb_interleave(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos, sin)
    torch.testing.assert_close(decoder._rope(x, 0, positions), theirs[0].transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_config_reading_and_refusals(deepseek_dir):
    config = DeepseekV3Config.read(AutoConfig.from_pretrained(deepseek_dir))
    assert (config.num_kv_heads, config.head_dim) == (1, 32 + 16)  # one latent "head" per token
    assert config.dense(0) and not config.dense(1) and config.mla.q_lora_rank == 64
    for bad, error, match in (
        ({"topk_method": "greedy"}, TTUnsupportedFeatureError, "topk_method"),
        ({"scoring_func": "softmax"}, TTUnsupportedFeatureError, "scoring_func"),
        ({"n_group": 3}, TTConfigError, "n_group"),
        ({"num_experts_per_tok": 5}, TTConfigError, "num_experts_per_tok"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1.0}}, TTUnsupportedFeatureError, "rope_type"),
        ({"hidden_act": "gelu"}, TTUnsupportedFeatureError, "hidden_act"),
    ):
        changed = AutoConfig.from_pretrained(deepseek_dir)
        for key, value in bad.items():
            setattr(changed, key, value)
        with pytest.raises(error, match=match):
            DeepseekV3Config.read(changed)


# ---- the whole model through the TT contract ---------------------------------------------


def latent(model: HostDeepseekV3ForCausalLM, seed: int = 0) -> ContractDriver:
    """The TT runner and vLLM's KV manager reduced to one MLA group: one latent tensor per
    layer (``tensor_idx`` = layer, as vLLM plans an attention-only model), one block table per
    request for every layer, blocks from a shuffled pool; unused blocks and the null block hold
    noise, so reading any of them changes the logits."""
    cfg = model.config
    shape = (NUM_BLOCKS, 1, BLOCK, cfg.head_dim)
    kv = model.allocate_kv_cache_per_layer([(shape, torch.float32, i) for i in range(cfg.num_layers)])
    assert all(keys is values for lane in kv for keys, values in lane)  # MLA: one tensor, read as K and V
    driver = ContractDriver(model, kv, [None] * cfg.num_layers, width=WIDTH, seed=seed, spoil="noise")
    for lane in range(model.lanes.count):
        driver.spoil(lane)
    return driver


def test_prefill_logits_at_every_position(deepseek_dir, hf_deepseek):
    runner = latent(build(deepseek_dir), seed=1)
    prompt = prompts(0, 100)[0]
    runner.add(0, prompt)
    out = runner.prefill([(0, 100)], return_all_logits=True)
    with torch.no_grad():
        theirs = hf_deepseek(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(out[0], theirs, atol=1e-4, rtol=1e-4)


def test_chunked_prefill_and_paged_decode_match_generate(deepseek_dir, hf_deepseek):
    from vllm_tt_host.tiny import corpus_text

    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(deepseek_dir)
    text = corpus_text()
    runner = latent(build(deepseek_dir), seed=2)
    runner.add(0, tokenizer(text[:600])["input_ids"][:90])  # the trained region: real margins
    runner.add(1, prompts(1, 20)[0])
    runner.prefill([(0, 27), (1, 20)])  # chunks end inside and across blocks
    runner.prefill([(0, 61)])
    runner.prefill([(0, 90)])
    runner.decode(14)
    for slot in (0, 1):
        assert_matches_hf(hf_deepseek, runner.seqs[slot])


@pytest.mark.parametrize("wrong", ["bias_in_weights", "no_correction_bias", "no_group_limit",
                                   "rope_pairs_not_interleaved", "rope_on_the_nope_part"])
def test_wrong_variants_change_outputs(deepseek_dir, hf_deepseek, monkeypatch, wrong):
    model = build(deepseek_dir)
    decoder = model.decoder
    true_route = ds_moe.route
    if wrong == "bias_in_weights":
        def biased(x, w, cfg):
            experts, _ = true_route(x, w, cfg)
            weights = (torch.nn.functional.linear(x, w.router).sigmoid() + w.correction_bias).gather(1, experts)
            return experts, weights / weights.sum(-1, keepdim=True) * cfg.routed_scaling_factor
        monkeypatch.setattr(ds_moe, "route", biased)
    elif wrong == "no_correction_bias":
        monkeypatch.setattr(ds_moe, "route", lambda x, w, cfg: true_route(
            x, dataclasses.replace(w, correction_bias=torch.zeros_like(w.correction_bias)), cfg))
    elif wrong == "no_group_limit":
        config = decoder.ds
        decoder.ds = dataclasses.replace(config, experts=dataclasses.replace(
            config.experts, n_group=1, topk_group=1))
    elif wrong == "rope_pairs_not_interleaved":
        decoder.ds = dataclasses.replace(decoder.ds, mla=dataclasses.replace(decoder.ds.mla, rope_interleave=False))
    else:
        mla = decoder.ds.mla
        true_qkv = decoder._qkv

        def rope_first(h, index, layer, positions):
            q, cached, _ = true_qkv(h, index, layer, positions)
            nope, rope = q.split((mla.qk_nope_head_dim, mla.qk_rope_head_dim), dim=-1)
            q = torch.cat((decoder._rope(rope, index, positions), nope), dim=-1)  # rotated part first
            return q, cached, cached
        monkeypatch.setattr(decoder, "_qkv", rope_first)
    runner = latent(model, seed=4)
    prompt = prompts(5, 150)[0]
    runner.add(0, prompt)
    out = runner.prefill([(0, 150)], return_all_logits=True)
    with torch.no_grad():
        theirs = hf_deepseek(torch.tensor([prompt])).logits[0]
    changed = (out[0].argmax(-1) != theirs.argmax(-1)).float().mean()
    assert (out[0] - theirs).abs().max() > 0.3, wrong  # parity is ~5e-6
    # The weights' and the group limit's mistakes move logits (0.4 and 2.3 measured) but flip
    # only 1-3% of greedy tokens, a count that moves with the trained weights (torch threads).
    assert wrong in ("bias_in_weights", "no_group_limit") or changed > 0.04, (wrong, float(changed))


def test_plain_queries_without_q_lora(tmp_path):
    """``q_lora_rank: null`` (DeepSeek V2 Lite's shape): one ``q_proj``; random weights suffice
    to compare logits."""
    from vllm_tt_host.tiny import build_config

    config = build_config("deepseek_v3", 1024, {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2})
    config.q_lora_rank = None
    config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.save_pretrained(tmp_path)
    runner = latent(build(tmp_path), seed=3)
    assert isinstance(runner.model.decoder._layers[0].attention.q, torch.Tensor)
    prompt = prompts(9, 40)[0]
    runner.add(0, prompt)
    out = runner.prefill([(0, 40)], return_all_logits=True)
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(out[0], theirs, atol=1e-4, rtol=1e-4)


def test_lanes_on_a_galaxy_mesh_keep_separate_latents(deepseek_dir, hf_deepseek):
    """TG (8, 4) as 4 in-process lanes of one row; every lane gets the same block ids."""
    model = build(deepseek_dir, batch=4, lanes=4, mesh=MeshShape(8, 4))
    assert model.lanes.count == 4
    runner = latent(model, seed=6)
    first, second = prompts(7, 45, 38)
    runner.add(0, first)
    runner.add(3, second)
    runner.prefill([(0, 45)])
    runner.prefill([(3, 38)])
    assert runner.seqs[0].tables[None][:2] == runner.seqs[3].tables[None][:2]
    runner.decode(6)
    assert_matches_hf(hf_deepseek, runner.seqs[0])
    assert_matches_hf(hf_deepseek, runner.seqs[3])


def test_kv_cache_spec_is_one_latent_per_layer(deepseek_dir):
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm_tt_testing.kv_planning import spec_view

    vllm_config = spec_view(AutoConfig.from_pretrained(deepseek_dir), torch.float32, BLOCK)
    specs = HostDeepseekV3ForCausalLM.get_kv_cache_spec(vllm_config)
    assert list(specs) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    for spec in specs.values():
        assert type(spec) is MLAAttentionSpec
        assert (spec.num_kv_heads, spec.head_size, spec.block_size) == (1, 48, BLOCK)
        assert spec.page_size_bytes == BLOCK * 48 * 4  # one latent, no separate V


def test_registered_for_the_host_backend():
    from vllm_tt_models_registry.contract import check_model_class

    module, name = HOST_MODELS["TTDeepseekV3ForCausalLM"].split(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    assert cls is HostDeepseekV3ForCausalLM
    caps = check_model_class(cls, owner="host")
    assert caps.supports_sample_on_device and cls.model_capabilities["single_program_lanes"]
    assert cls.model_capabilities["kv_cache_kinds"] == ["mla"]
