"""The host Gemma 4 text model against transformers' own ``Gemma4ForCausalLM``, through the
hybrid-KV contract: sliding layers of 2 KV heads x 32 and full layers of 1 KV head x 64 (values
from keys), the last two layers reading the KV of layer 3 (sliding) and layer 2 (full) and
writing none. Layers of both kinds share one storage slot as vLLM overlays them (views of one
buffer, different shapes); a KV-shared layer gets its source's storage and its group's table;
blocks a sliding group drops are filled with NaN. The E-series variant (``gemma4_e``: the same
layers plus per-layer input embeddings and the KV-shared layers' double-wide MLP) and the
mixture-of-experts variant (``gemma4_moe``: 4 experts, top-2, beside each dense MLP) pass the
same parity tests."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.gemma4.model import Gemma4Config, Gemma4Decoder, HostGemma4ForCausalLM
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_testing.checkpoints import parity_fixtures
from vllm_tt_testing.contract_driver import ContractDriver
from vllm_tt_testing.parity import (
    assert_every_position_matches,
    assert_matches_hf,
    assert_mistake_shows,
    hf_all_logits,
    prompts,
)

BLOCK = 16
NUM_BLOCKS = 128
WIDTH = 24
"""Page-table width (blocks per row): 384 positions."""
STORAGE_OF_OWNER = {0: 0, 1: 1, 2: 0, 3: 2}
"""KV-owning layer -> storage slot: sliding layer 0 and full layer 2 overlaid (one block pool,
disjoint blocks); the driver's sliding layers share one table, so each gets its own slot."""
TRAIN_STEPS = 100

checkpoint, hf, model = parity_fixtures("gemma4", TRAIN_STEPS, HostGemma4ForCausalLM, 4, WIDTH * BLOCK)
"""The tiny Gemma 4 (s s f s | s f shared; window 32), trained so greedy margins are real; built
once per session: tests/e2e/test_gemma4_serve.py reuses the folder (same recipe)."""
e_checkpoint, e_hf, e_model = parity_fixtures(
    "gemma4_e", TRAIN_STEPS, HostGemma4ForCausalLM, 4, WIDTH * BLOCK, prefix="e_"
)
"""The E-series variant (16 per-layer input values per layer); tests/e2e/test_gemma4_e_serve.py
reuses it."""
moe_checkpoint, moe_hf, moe_model = parity_fixtures(
    "gemma4_moe", TRAIN_STEPS, HostGemma4ForCausalLM, 4, WIDTH * BLOCK, prefix="moe_"
)
"""The mixture-of-experts variant; tests/e2e/test_gemma4_variants_serve.py reuses it."""
VARIANTS = ("", "e_", "moe_")
"""Fixture prefixes of the two tiny models the parity tests run on."""


def per_layer_specs(config: Gemma4Config, blocks: int = NUM_BLOCKS, full_block: int = BLOCK,
                    storage: dict[int, int] = STORAGE_OF_OWNER) -> list[tuple[tuple[int, ...], torch.dtype, int]]:
    """What the runner passes: each layer's own shape (a full layer's blocks ``full_block``
    tokens long); a KV-shared layer its source's slot."""
    return [
        ((blocks, config.kv_heads_of(i), BLOCK if config.window(i) else full_block, config.head_dim_of(i)),
         torch.float32, storage[config.kv_source(i)])
        for i in range(config.num_layers)
    ]


def hybrid(model: HostGemma4ForCausalLM, seed: int = 0, **specs) -> ContractDriver:
    cfg = model.config
    kv = model.allocate_kv_cache_per_layer(per_layer_specs(cfg, **specs))
    windows = [cfg.window(i) for i in range(cfg.num_layers)]
    return ContractDriver(model, kv, windows, width=WIDTH, seed=seed, spoil="nan")


def wrong_logits(model, prompt: list[int], weights=None, **config_changes) -> torch.Tensor:
    """Logits of the same weights (or ``weights``) with one config field changed (a plausible
    mistake)."""
    config = dataclasses.replace(model.config, **config_changes)
    decoder = Gemma4Decoder(config, weights or model.decoder.weights)
    lane_kv = model.allocate_kv_cache_per_layer(per_layer_specs(config))[0]
    tables = [torch.arange(1, WIDTH + 1, dtype=torch.int32) + (40 if config.window(i) else 0)
              for i in range(config.num_layers)]
    with torch.no_grad():
        return decoder.prefill(torch.tensor(prompt), 0, 1024, tables, lane_kv, all_positions=True)


def test_config_reads_per_layer_kv_shapes_and_sources(model):
    cfg = model.config
    assert cfg.layer_windows == (32, 32, None, 32, 32, None)
    assert cfg.layer_head_dims == (32, 32, 64, 32, 32, 64)
    assert cfg.layer_kv_heads == (2, 2, 1, 2, 2, 1)
    assert cfg.layer_kv_sources == (0, 1, 2, 3, 3, 2)
    assert cfg.values_from_keys and cfg.rope.rotary_fraction == 0.25
    assert (cfg.rope.rope_type, cfg.rope.theta, cfg.local_rope.theta) == ("proportional", 1e6, 1e4)
    assert cfg.per_layer_input_size == 0 and model.decoder.weights.per_layer_embedding is None


def test_e_series_config_reads_per_layer_inputs_and_double_wide_mlp(e_model):
    cfg, weights = e_model.config, e_model.decoder.weights
    assert cfg.per_layer_input_size == 16 and cfg.layer_kv_sources == (0, 1, 2, 3, 3, 2)
    assert weights.per_layer_embedding.table.shape == (cfg.vocab_size, 6 * 16)
    assert [layer.mlp.gate.shape[0] for layer in weights.layers] == [256] * 4 + [512] * 2


def test_moe_config_reads_the_routed_block(moe_model, moe_checkpoint):
    cfg, layer = moe_model.config, moe_model.decoder.weights.layers[5]
    assert (cfg.experts, cfg.experts_per_token, cfg.per_layer_input_size) == (4, 2, 0)
    assert layer.experts.gate_up.shape == (4, 128, 128) and layer.experts.down.shape == (4, 128, 64)
    config = AutoConfig.from_pretrained(moe_checkpoint)
    for name, value in (("top_k_experts", 5), ("num_experts", None)):
        with pytest.raises(TTConfigError, match=name):
            Gemma4Config.read(types.SimpleNamespace(**{**config.to_dict(), "per_layer_config": config.per_layer_config,
                                                       name: value}))


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_logits_match_transformers_at_every_position(request, variant):
    model, hf = request.getfixturevalue(variant + "model"), request.getfixturevalue(variant + "hf")
    prompt = prompts(0, 230)[0]  # 7 windows long
    assert_every_position_matches(hybrid(model).prompt_logits(prompt), hf_all_logits(hf, prompt))


def test_e_series_without_per_layer_inputs_is_wrong(e_model, e_hf):
    """The per-layer inputs matter in the tiny E model: dropping them moves every logit."""
    prompt = prompts(1, 120)[0]
    weights = e_model.decoder.weights
    without = dataclasses.replace(weights, per_layer_embedding=None)
    assert_mistake_shows(wrong_logits(e_model, prompt, weights=without), wrong_logits(e_model, prompt),
                         hf_all_logits(e_hf, prompt), "per-layer inputs ignored")


def test_moe_without_the_routed_block_is_wrong(moe_model, moe_hf):
    """The experts matter in the tiny MoE model: dropping them moves every logit."""
    prompt = prompts(1, 120)[0]
    weights = moe_model.decoder.weights
    dense = dataclasses.replace(weights, layers=tuple(dataclasses.replace(layer, experts=None)
                                                     for layer in weights.layers))
    assert_mistake_shows(wrong_logits(moe_model, prompt, weights=dense), wrong_logits(moe_model, prompt),
                         hf_all_logits(moe_hf, prompt), "routed experts ignored")


@pytest.mark.parametrize(
    ("mistake", "changes"),
    [
        ("shared sliding layer reads layer 1", lambda config: {"layer_kv_sources": (0, 1, 2, 3, 1, 2)}),
        ("whole full head rotates", lambda config: {"rope": dataclasses.replace(config.rope, rotary_fraction=1.0)}),
        ("no sliding window", lambda config: {"layer_windows": (None,) * 6}),
    ],
)
def test_plausible_mistakes_change_the_logits(model, hf, mistake, changes):
    """Each moves the logits far past the parity tolerance and changes greedy tokens."""
    prompt = prompts(1, 200)[0]
    wrong = wrong_logits(model, prompt, **changes(model.config))
    assert_mistake_shows(wrong, wrong_logits(model, prompt), hf_all_logits(hf, prompt), mistake)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_through_per_layer_page_tables_matches_generate(request, variant):
    """Three requests in one fixed batch (slot 1 padding): prompts shorter than, across and far
    past the window, prefilled in chunks, then decode whose sliding groups drop (and poison)
    every block leaving the window; logits equal HF's at every step, tokens equal generate()'s."""
    model, hf = request.getfixturevalue(variant + "model"), request.getfixturevalue(variant + "hf")
    runner = hybrid(model, seed=1)
    short, middle, long = prompts(2, 20, 45, 260)
    for slot, prompt in ((0, short), (2, middle), (3, long)):
        runner.add(slot, prompt)
    runner.prefill([(0, 20), (2, 45)])
    runner.prefill([(3, 100)])
    runner.prefill([(3, 260)])
    runner.decode(16)
    assert runner.seqs[3].tables[32][:15] == [0] * 15  # the window moved on
    worst = max(assert_matches_hf(hf, runner.seqs[slot]) for slot in (0, 2, 3))
    assert runner.null_block_untouched()
    print(f"gemma4 {variant or 'text_'}decode parity: max |logit diff| {worst:.2e}")


def test_full_and_sliding_layers_of_different_block_sizes_match_generate(model, hf):
    """Mixed page sizes: the full layers' blocks hold twice the sliding layers' tokens (vLLM
    grows the block size of the smaller-page group until the pages agree; here each group has
    storage of its own). Each layer locates, gathers and windows with its own block size: every
    prompt position, chunked prefill across both sizes' block edges, then decode, equal HF."""
    own_slots = {0: 0, 1: 1, 2: 3, 3: 2}
    prompt = prompts(0, 230)[0]
    full = hybrid(model, full_block=2 * BLOCK, storage=own_slots)
    assert full.group_block == {32: BLOCK, None: 2 * BLOCK}
    assert_every_position_matches(full.prompt_logits(prompt), hf_all_logits(hf, prompt))
    runner = hybrid(model, seed=1, full_block=2 * BLOCK, storage=own_slots)
    short, long = prompts(2, 20, 140)
    runner.add(0, short)
    runner.add(3, long)
    runner.prefill([(0, 20), (3, 40)])  # 40: inside a full block, past a sliding one
    runner.prefill([(3, 140)])
    runner.decode(12)
    assert len(runner.seqs[3].tables[None]) == 5 and len(runner.seqs[3].tables[32]) == 10
    worst = max(assert_matches_hf(hf, runner.seqs[slot]) for slot in (0, 3))
    assert runner.null_block_untouched()
    print(f"gemma4 mixed block sizes decode parity: max |logit diff| {worst:.2e}")


def test_shared_layers_get_their_sources_storage(model):
    """Layer 4 (sliding) aliases layer 3's tensors, layer 5 (full) layer 2's; layers 0 and 2
    (different shapes, one page size) are views of one buffer, block for block."""
    kv = model.allocate_kv_cache_per_layer(per_layer_specs(model.config, blocks=10))[0]
    assert kv[4][0] is kv[3][0] and kv[4][1] is kv[3][1]
    assert kv[5][0] is kv[2][0] and kv[5][1] is kv[2][1]
    assert kv[0][0].shape == (10, 2, BLOCK, 32) and kv[2][0].shape == (10, 1, BLOCK, 64)
    assert kv[0][0].untyped_storage().data_ptr() == kv[2][0].untyped_storage().data_ptr()
    kv[2][0][7].fill_(1.0)  # block 7 of the full layer is block 7 of the sliding layer
    assert kv[0][0][7].eq(1.0).all() and not kv[0][0][6].any()
    with pytest.raises(HostModelInputError, match="shares KV tensor 0"):
        model.allocate_kv_cache_per_layer([((10, 2, BLOCK, 32), None, 0)] + [((12, 2, BLOCK, 32), None, 0)] * 5)


def test_kv_cache_spec_omits_shared_layers_and_names_their_targets(checkpoint):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    from vllm_tt_testing.kv_planning import spec_view

    vllm_config = spec_view(AutoConfig.from_pretrained(checkpoint), torch.bfloat16, 64)
    specs = HostGemma4ForCausalLM.get_kv_cache_spec(vllm_config)
    assert list(specs) == [f"model.layers.{i}.self_attn" for i in range(4)]
    assert [type(s) for s in specs.values()] == [SlidingWindowSpec] * 2 + [FullAttentionSpec, SlidingWindowSpec]
    assert [(s.num_kv_heads, s.head_size) for s in specs.values()] == [(2, 32), (2, 32), (1, 64), (2, 32)]
    assert len({s.page_size_bytes for s in specs.values()}) == 1  # vLLM pools them as they are
    assert HostGemma4ForCausalLM.get_kv_sharing_targets(vllm_config) == {
        "model.layers.4.self_attn": "model.layers.3.self_attn",
        "model.layers.5.self_attn": "model.layers.2.self_attn",
    }


def test_config_reading_refuses_what_the_host_does_not_implement(checkpoint):
    config = AutoConfig.from_pretrained(checkpoint)
    assert Gemma4Config.read(config, n_layers=5).layer_kv_sources == (0, 1, 2, 3, 3)
    for name, value, error in (
        ("use_bidirectional_attention", "all", TTUnsupportedFeatureError),
        ("hidden_activation", "silu", TTUnsupportedFeatureError),
        ("num_kv_shared_layers", 4, TTConfigError),  # layer 2 (full) would have no earlier full layer
        ("per_layer_config", None, TTConfigError),
        ("rope_parameters", {"sliding_attention": {"rope_type": "yarn"}, "full_attention": {}},
         TTUnsupportedFeatureError),
    ):
        broken = types.SimpleNamespace(
            **{k: getattr(config, k) for k in (
                "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "layer_types", "sliding_window", "hidden_activation", "per_layer_config", "rope_parameters",
                "num_kv_shared_layers", "attention_k_eq_v",
            )},
        )
        setattr(broken, name, value)
        with pytest.raises(error, match=name):
            Gemma4Config.read(broken)


def test_registered_for_the_host_backend():
    from vllm_tt_models_registry.contract import check_model_class

    module, name = HOST_MODELS["TTGemma4ForCausalLM"].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is HostGemma4ForCausalLM
    capabilities = check_model_class(HostGemma4ForCausalLM, owner="host")
    assert capabilities.supports_sample_on_device
