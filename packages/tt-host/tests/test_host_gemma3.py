"""The host Gemma 3 text model against transformers' own ``Gemma3ForCausalLM``, driven through
the hybrid-KV contract the way the runner drives it: one KV cache group per attention kind
(sliding layers, full layers), one block pool shared by the groups, layers of different groups
sharing storage (``tensor_idx``), and per-layer page tables in which a sliding group's blocks
that left the window are zeroed (vLLM's null block) after being poisoned with NaN, so reading
one would show."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.gemma3.model import Gemma3Config, Gemma3Decoder, HostGemma3ForCausalLM
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.checkpoints import parity_fixtures
from vllm_tt_testing.contract_driver import ContractDriver
from vllm_tt_testing.parity import (
    assert_every_position_matches,
    assert_matches_hf,
    assert_mistake_shows,
    hf_all_logits,
    hf_greedy,
    prompts,
)

BLOCK = 16
NUM_BLOCKS = 128
WIDTH = 24
"""Page-table width (blocks per row): 384 positions."""
TENSOR_IDX = (0, 1, 0)
"""Layer -> KV tensor, as vLLM's hybrid manager shares them: sliding layer 0 with full layer 2."""
TRAIN_STEPS = 200

checkpoint, hf, model = parity_fixtures("gemma3", TRAIN_STEPS, HostGemma3ForCausalLM, 4, WIDTH * BLOCK)
"""The tiny Gemma 3 (sliding, sliding, full; window 32), trained so greedy margins are real; built
once per session: tests/e2e/test_gemma3_serve.py reuses the folder (same recipe)."""


def hybrid(model: HostGemma3ForCausalLM, seed: int = 0, free_outside_window: bool = True) -> ContractDriver:
    """vLLM's hybrid KV manager and the TT runner over ``TENSOR_IDX``; blocks a sliding group
    drops are filled with NaN and never handed out again, so reading one would show."""
    cfg = model.config
    shape = (NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim)
    kv = model.allocate_kv_cache_per_layer([(shape, torch.float32, t) for t in TENSOR_IDX])
    windows = [cfg.window(i) for i in range(cfg.num_layers)]
    return ContractDriver(
        model, kv, windows, width=WIDTH, seed=seed, spoil="nan", free_outside_window=free_outside_window
    )


def wrong_logits(model, prompt: list[int], **config_changes) -> torch.Tensor:
    """Logits of the same weights with one config field changed (a plausible mistake)."""
    config = dataclasses.replace(model.config, **config_changes)
    decoder = Gemma3Decoder(config, model.decoder.weights)
    lane_kv = hybrid(model).kv[0]
    table = torch.arange(1, WIDTH + 1, dtype=torch.int32)
    with torch.no_grad():
        return decoder.prefill(torch.tensor(prompt), 0, 1024, [table] * config.num_layers, lane_kv, all_positions=True)


def test_prefill_logits_match_transformers_at_every_position(model, hf):
    prompt = prompts(0, 230)[0]  # 7 windows long
    assert_every_position_matches(hybrid(model).prompt_logits(prompt), hf_all_logits(hf, prompt))


@pytest.mark.parametrize(
    ("mistake", "changes"),
    [
        ("no sliding window", lambda config: {"layer_windows": (None, None, None)}),
        ("global rope on local layers", lambda config: {"local_rope": config.rope}),
        ("window one token wider", lambda config: {"layer_windows": (33, 33, None)}),
        ("head_dim attention scale", lambda config: {"query_pre_attn_scalar": float(config.head_dim)}),
    ],
)
def test_plausible_mistakes_change_the_logits(model, hf, mistake, changes):
    """The parity tests above would catch each of these: they move the logits far past the
    tolerance and change greedy tokens."""
    prompt = prompts(1, 200)[0]
    wrong = wrong_logits(model, prompt, **changes(model.config))
    assert_mistake_shows(wrong, wrong_logits(model, prompt), hf_all_logits(hf, prompt), mistake)


def test_decode_through_per_layer_page_tables_matches_generate(model, hf):
    """Three requests in one fixed batch (slot 1 padding): prompts shorter than, across and far
    past the window, then token-by-token decode whose sliding group drops (and poisons) every
    block that leaves the window; logits equal HF's at every step, tokens equal generate()'s."""
    runner = hybrid(model, seed=1)
    short, middle, long = prompts(2, 20, 45, 260)
    for slot, prompt in ((0, short), (2, middle), (3, long)):
        runner.add(slot, prompt)
    runner.prefill([(0, 20), (2, 45)])
    runner.prefill([(3, 260)])
    runner.decode(16)
    assert runner.seqs[3].tables[32][:15] == [0] * 15  # the window moved on
    for slot in (0, 2, 3):
        assert_matches_hf(hf, runner.seqs[slot])


@pytest.mark.parametrize("chunks", [(40, 100), (37, 70, 131), (16, 32, 48, 64, 150)])
def test_chunked_prefill_across_the_window_equals_one_shot(model, chunks):
    """Chunks ending before, on and after block and window boundaries; each chunk starts with
    the sliding group's blocks before its window already dropped."""
    prompt = prompts(3, chunks[-1])[0]
    one_shot = hybrid(model, seed=2)
    one_shot.add(0, prompt)
    one_shot.prefill([(0, len(prompt))])
    one_shot.decode(4)

    chunked = hybrid(model, seed=3)
    chunked.add(0, prompt)
    for end in chunks:
        chunked.prefill([(0, end)])
    chunked.decode(4)
    assert chunked.seqs[0].generated == one_shot.seqs[0].generated
    for ours, theirs in zip(chunked.seqs[0].logits, one_shot.seqs[0].logits, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_freed_sliding_blocks_are_never_read(model):
    """The same requests with and without vLLM dropping out-of-window blocks: equal logits,
    although dropped blocks hold NaN and their table entries point at block 0."""
    results = []
    for free in (False, True):
        runner = hybrid(model, seed=4, free_outside_window=free)
        runner.add(0, prompts(4, 150)[0])
        runner.prefill([(0, 90)])
        runner.prefill([(0, 150)])
        runner.decode(6)
        if free:
            assert runner.seqs[0].tables[32][:6] == [0] * 6
            block0 = [t[0] for layer in runner.kv[0] for t in layer]
            assert all(not b.any() for b in block0)  # the null block stays untouched
        results.append(runner.seqs[0])
    assert results[0].generated == results[1].generated
    for kept, dropped in zip(results[0].logits, results[1].logits, strict=True):
        assert torch.isfinite(dropped).all()
        torch.testing.assert_close(kept, dropped, atol=1e-5, rtol=1e-5)


def test_attention_softcapping_is_ignored_like_transformers(checkpoint, model):
    """``attn_logit_softcapping`` is a Gemma 2 field: transformers' Gemma 3 (and vLLM's) never
    apply it, so a config that sets it must not change our logits either."""
    config = AutoConfig.from_pretrained(checkpoint)
    config.attn_logit_softcapping = 0.5
    hf = AutoModelForCausalLM.from_pretrained(
        checkpoint, config=config, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ours = HostGemma3ForCausalLM.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), 4, 256)
    prompt = prompts(5, 80)[0]
    assert (hybrid(ours).prompt_logits(prompt) - hf_all_logits(hf, prompt)).abs().max().item() < 1e-4


def test_greedy_generate_parity_on_text(checkpoint, model, hf):
    """Real text prompts of 100-300 tokens, decoded side by side in one batch."""
    from transformers import AutoTokenizer
    from vllm_tt_host.tiny import corpus_text

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    text = corpus_text()
    ids = tokenizer(text[:4000])["input_ids"]
    runner = hybrid(model, seed=5)
    lengths = {0: 110, 1: 190, 2: 300}
    for slot, n in lengths.items():
        runner.add(slot, ids[slot * 7 : slot * 7 + n])
    runner.prefill([(0, 110), (1, 128)])
    runner.prefill([(1, 190), (2, 300)])
    runner.decode(15)
    for slot in lengths:
        seq = runner.seqs[slot]
        tokens, _ = hf_greedy(hf, seq.prompt, len(seq.generated))
        assert seq.generated == tokens, slot


def test_kv_cache_spec_names_each_layer_kind(checkpoint):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    from vllm_tt_testing.kv_planning import spec_view

    vllm_config = spec_view(AutoConfig.from_pretrained(checkpoint), torch.bfloat16, 64)
    specs = HostGemma3ForCausalLM.get_kv_cache_spec(vllm_config)
    assert list(specs) == [f"model.layers.{i}.self_attn" for i in range(3)]
    assert [type(s) for s in specs.values()] == [SlidingWindowSpec, SlidingWindowSpec, FullAttentionSpec]
    assert specs["model.layers.0.self_attn"].sliding_window == 32
    for spec in specs.values():
        assert (spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype) == (64, 2, 32, torch.bfloat16)


def test_layers_with_one_tensor_idx_share_storage(model):
    cfg = model.config
    shape = (10, 1, BLOCK, cfg.head_dim)  # one device's share of the kv heads
    kv = model.allocate_kv_cache_per_layer([(shape, torch.bfloat16, t) for t in TENSOR_IDX])
    assert len(kv) == 1 and len(kv[0]) == 3
    assert kv[0][0][0] is kv[0][2][0] and kv[0][0][1] is kv[0][2][1]
    assert kv[0][1][0] is not kv[0][0][0]
    assert kv[0][1][0].shape == (10, 2, BLOCK, cfg.head_dim) and kv[0][1][0].dtype == torch.float32
    with pytest.raises(HostModelInputError, match="shares KV tensor 0"):
        model.allocate_kv_cache_per_layer([((10, 2, BLOCK, 32), None, 0), ((10, 2, BLOCK, 32), None, 1),
                                           ((12, 2, BLOCK, 32), None, 0)])
    with pytest.raises(HostModelInputError, match="3 layers"):
        model.allocate_kv_cache_per_layer([(shape, None, 0)] * 2)


def test_page_tables_per_layer_must_name_every_layer(model):
    runner = hybrid(model)
    runner.add(0, prompts(6, 10)[0])
    tables = runner.page_tables([0, None, None, None], WIDTH)
    with pytest.raises(HostModelInputError, match="2 tables, the model has 3 layers"):
        model.prefill_forward(
            tokens=torch.zeros(1, 10, dtype=torch.int32), page_table=tables[0][:1], kv_cache=runner.kv,
            prompt_lens=[10], page_tables_per_layer=tables[:2],
        )


def test_config_reading(checkpoint):
    config = AutoConfig.from_pretrained(checkpoint)
    ours = Gemma3Config.read(config)
    assert ours.layer_windows == (32, 32, None)
    assert (ours.rope_of(0).theta, ours.rope_of(2).theta, ours.rope_of(2).rope_type) == (1e4, 1e6, "linear")
    assert ours.rope_of(2).factor == 8.0 and ours.final_logit_softcapping == 30.0
    assert Gemma3Config.read(config, n_layers=2).layer_windows == (32, 32)
    legacy = types.SimpleNamespace(
        **{k: getattr(config, k) for k in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "layer_types", "sliding_window", "hidden_activation",
        )},
        rope_theta=500_000.0, rope_local_base_freq=20_000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
    )
    old = Gemma3Config.read(legacy)
    assert (old.rope.theta, old.rope.factor, old.local_rope.theta) == (500_000.0, 4.0, 20_000.0)
    for name, value, error in (
        ("use_bidirectional_attention", True, TTUnsupportedFeatureError),
        ("hidden_activation", "silu", TTUnsupportedFeatureError),
        ("sliding_window", None, TTConfigError),
        ("layer_types", ["sliding_attention", "chunked_attention", "full_attention"], TTConfigError),
    ):
        broken = types.SimpleNamespace(**{**vars(legacy), name: value})
        with pytest.raises(error, match=name):
            Gemma3Config.read(broken)


def test_registered_for_the_host_backend():
    from vllm_tt_models_registry.contract import check_model_class

    module, name = HOST_MODELS["TTGemma3ForCausalLM"].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is HostGemma3ForCausalLM
    assert check_model_class(HostGemma3ForCausalLM, owner="host").supports_sample_on_device
