"""The host Qwen 3.5 text model against transformers' ``Qwen3_5ForCausalLM``, driven through the
TT contract the way the runner drives it over vLLM's hybrid KV plan: paged K/V for the
attention layer (a shuffled block pool), one state block per request for each delta-net layer
(entry 0 of that group's table row), every unused block and state filled with noise, prompts
in prefill chunks (some shorter than the convolution window), paged decode. Then the KV spec
the worker hands vLLM, read back through vLLM's own planning and the runner's layout.

Verify steps of speculative decoding, driven as the runner drives them: each request holds
``1 + K`` state blocks per delta-net layer (vLLM's ``num_speculative_blocks``), a ring by
position (``KVGroup.state_blocks``), so a verify step leaves the state after each of its
positions in its own block and the next step reads the one of the last kept position. Logits at
every verify position equal transformers' whether the drafts there are kept or rejected, the
state the next step starts from after a partial accept equals a plain prefill's, and generation
continued after verify steps stays transformers' greedy run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.qwen3_5 import gated_delta
from vllm_tt_host.models.qwen3_5.config import Qwen3_5Config
from vllm_tt_host.models.qwen3_5.gated_delta import RecurrentState
from vllm_tt_host.models.qwen3_5.model import HostQwen3_5ForCausalLM
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.checkpoints import cached_tiny
from vllm_tt_testing.contract_driver import RECURRENT, ContractDriver
from vllm_tt_testing.parity import assert_matches_hf, hf_all_logits, hf_greedy, prompts

BLOCK = 16
NUM_BLOCKS = 40
WIDTH = 10
"""Page-table width (blocks per row): 160 positions."""
TRAIN_STEPS = 100
"""Shared with tests/e2e/test_qwen3_5_serve.py (same recipe, one build per session)."""


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return cached_tiny("qwen3_5", TRAIN_STEPS)


@pytest.fixture(scope="session")
def hf_qwen(qwen_dir: Path):
    return AutoModelForCausalLM.from_pretrained(qwen_dir, dtype=torch.float32).eval()


def build(folder: Path, batch: int = 2) -> HostQwen3_5ForCausalLM:
    model = HostQwen3_5ForCausalLM.initialize_vllm_model(
        AutoConfig.from_pretrained(folder), HostMeshDevice(MeshShape(1, 1)), batch, WIDTH * BLOCK
    )
    assert isinstance(model, HostQwen3_5ForCausalLM)
    return model


def drive(model: HostQwen3_5ForCausalLM, seed: int, state_boundaries: bool = False,
          state_slots: int = 1) -> ContractDriver:
    """The contract driver over vLLM's plan reduced to one lane: a full-attention group (one
    block per ``BLOCK`` tokens) and a recurrent group (one state block per request, or with
    ``state_boundaries`` vLLM's align-mode row of a state per block, or with ``state_slots``
    speculative decoding's ring of states), from one shuffled pool; every block and state
    starts as noise."""
    cfg = model.config
    assert isinstance(cfg, Qwen3_5Config)
    states = ((NUM_BLOCKS, *cfg.delta.conv_state_shape), (NUM_BLOCKS, *cfg.delta.recurrent_state_shape))
    attention = (NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim)
    kv = model.allocate_kv_cache_per_layer([
        (states, (torch.float32, torch.float32), 0) if cfg.linear(i) else (attention, torch.float32, 0)
        for i in range(cfg.num_layers)
    ])
    kinds = [RECURRENT if cfg.linear(i) else None for i in range(cfg.num_layers)]
    driver = ContractDriver(model, kv, kinds, width=WIDTH, seed=seed, spoil="noise", state_boundaries=state_boundaries,
                            state_slots=state_slots)
    driver.spoil(0)
    return driver


def _trained_text(folder: Path, length: int) -> list[int]:
    from vllm_tt_host.tiny import corpus_text

    return AutoTokenizer.from_pretrained(folder)(corpus_text()[:800])["input_ids"][:length]


def test_chunked_prefill_and_decode_match_generate(qwen_dir, hf_qwen):
    """Chunks end inside and across blocks, one is shorter than the convolution window (2 < 3
    states): each continues the state the last one left in the request's block."""
    runner = drive(build(qwen_dir), 1)
    runner.add(0, _trained_text(qwen_dir, 90))  # the trained region: real greedy margins
    runner.add(1, prompts(1, 20)[0])
    runner.prefill([(0, 27), (1, 20)])
    runner.prefill([(0, 29)])
    runner.prefill([(0, 61)])
    runner.prefill([(0, 90)])
    runner.decode(14)
    worst = max(assert_matches_hf(hf_qwen, runner.seqs[slot]) for slot in (0, 1))
    assert worst < 1e-4
    assert runner.null_block_untouched()


def test_prefill_logits_at_every_position(qwen_dir, hf_qwen):
    runner = drive(build(qwen_dir), 2)
    prompt = prompts(3, 70)[0]
    runner.add(0, prompt)
    head = runner.prefill([(0, 33)], return_all_logits=True)
    tail = runner.prefill([(0, 70)], return_all_logits=True)
    with torch.no_grad():
        theirs = hf_qwen(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(torch.cat((head[0], tail[0])), theirs, atol=1e-4, rtol=1e-4)


def test_a_chunk_that_ignores_the_carried_state_goes_wrong(qwen_dir, hf_qwen, monkeypatch):
    """The chunk tests would pass with a state reset per chunk only if the state did not matter:
    right after the boundary, logits move by up to 4.5 (parity: 7e-6)."""
    true_read = RecurrentState.read
    monkeypatch.setattr(RecurrentState, "read", lambda self, blocks, fresh: true_read(self, blocks, fresh | True))
    runner = drive(build(qwen_dir), 3)
    prompt = prompts(4, 80)[0]
    runner.add(0, prompt)
    runner.prefill([(0, 40)])
    out = runner.prefill([(0, 80)], return_all_logits=True)
    with torch.no_grad():
        theirs = hf_qwen(torch.tensor([prompt])).logits[0, 40:44]
    assert (out[0, :4] - theirs).abs().max() > 1.0


def test_states_at_block_boundaries_equal_recompute_and_a_prefix_hit_continues_from_them(qwen_dir, hf_qwen):
    """vLLM's align mode (prefix caching on): chunks ending on block boundaries leave the state
    there in that block, equal to a recompute of the prefix in one chunk; a second request with
    the same 96-token prefix and another suffix starts from the cached state and equals
    transformers, as does the first request's decode across a boundary."""
    model = build(qwen_dir)
    runner = drive(model, 5, state_boundaries=True)
    text = _trained_text(qwen_dir, 120)
    runner.add(0, text[:110])
    runner.prefill([(0, 64)])
    runner.prefill([(0, 96)])
    runner.prefill([(0, 110)])
    runner.decode(5)  # 110..114, then into block 7 at 112
    cached = runner.seqs[0].tables[RECURRENT]
    assert [block != 0 for block in cached] == [False] * 3 + [True] + [False] + [True, True, True]
    fresh = drive(model, 6, state_boundaries=True)
    fresh.add(0, text[:96])
    fresh.prefill([(0, 96)])
    layers = [i for i in range(model.config.num_layers) if model.config.linear(i)]
    for layer in layers:
        ours: RecurrentState = runner.kv[0][layer]
        recomputed: RecurrentState = fresh.kv[0][layer]
        kept, again = cached[5], fresh.seqs[0].tables[RECURRENT][5]
        torch.testing.assert_close(ours.recurrent[kept], recomputed.recurrent[again], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.conv[kept], recomputed.conv[again], atol=1e-5, rtol=1e-5)
    runner.add(1, text[:96] + text[100:120], prefix_of=0, cached_blocks=6)
    assert runner.seqs[1].computed == 96
    runner.prefill([(1, 116)])
    runner.decode(6)
    worst = max(assert_matches_hf(hf_qwen, runner.seqs[slot]) for slot in (0, 1))
    assert worst < 1e-4
    assert runner.null_block_untouched()


def test_a_hit_that_reads_the_state_after_another_boundary_goes_wrong(qwen_dir, hf_qwen):
    """The hit test would pass if any cached state would do: started from the 64-token state
    instead of the 96-token one, the suffix's logits move far past the parity tolerance."""
    runner = drive(build(qwen_dir), 7, state_boundaries=True)
    text = _trained_text(qwen_dir, 120)
    runner.add(0, text[:100])
    for end in (64, 96, 100):
        runner.prefill([(0, end)])
    runner.add(1, text[:96] + text[100:116], prefix_of=0, cached_blocks=6)
    states = runner.seqs[1].tables[RECURRENT]
    states[5] = runner.seqs[0].tables[RECURRENT][3]  # the 64-token state where the 96-token one was
    out = runner.prefill([(1, 112)], return_all_logits=True)
    with torch.no_grad():
        theirs = hf_qwen(torch.tensor([runner.seqs[1].prompt])).logits[0, 96:112]
    assert (out[0] - theirs).abs().max() > 1.0


def test_gated_delta_rule_chunks_compose():
    """Two calls over a split sequence give one call's outputs and state (the chunk contract)."""
    gen = torch.Generator().manual_seed(0)
    q, k = (gated_delta.l2_normalize(torch.randn(2, 9, 3, 8, generator=gen)) for _ in range(2))
    v = torch.randn(2, 9, 3, 5, generator=gen)
    decay, beta = -torch.rand(2, 9, 3, generator=gen), torch.rand(2, 9, 3, generator=gen)
    state = torch.randn(2, 3, 8, 5, generator=gen)
    whole, last = gated_delta.gated_delta_rule(q, k, v, decay, beta, state)
    first, mid = gated_delta.gated_delta_rule(q[:, :4], k[:, :4], v[:, :4], decay[:, :4], beta[:, :4], state)
    second, end = gated_delta.gated_delta_rule(q[:, 4:], k[:, 4:], v[:, 4:], decay[:, 4:], beta[:, 4:], mid)
    torch.testing.assert_close(torch.cat((first, second), 1), whole)
    torch.testing.assert_close(end, last)
    x, weight = torch.randn(1, 7, 6, generator=gen), torch.randn(6, 4, generator=gen)
    window = torch.randn(1, 6, 3, generator=gen)
    out, after = gated_delta.causal_conv(x, window, weight)
    a, w1 = gated_delta.causal_conv(x[:, :2], window, weight)  # shorter than the window
    b, w2 = gated_delta.causal_conv(x[:, 2:], w1, weight)
    torch.testing.assert_close(torch.cat((a, b), 1), out)
    torch.testing.assert_close(w2, after)


def test_config_reading_and_refusals(qwen_dir):
    config = Qwen3_5Config.read(AutoConfig.from_pretrained(qwen_dir))
    assert config.layer_kinds == ("linear_attention",) * 3 + ("full_attention",)
    assert (config.rotary_dim, config.delta.conv_dim) == (8, 2 * 2 * 32 + 4 * 32)
    for bad, error, match in (
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0}}, TTUnsupportedFeatureError,
         "rope_type"),
        ({"linear_num_value_heads": 3}, TTConfigError, "linear_num_value_heads"),
        ({"layer_types": ["linear_attention", "sliding_attention"] * 2}, TTConfigError, "layer_types"),
        ({"hidden_act": "gelu"}, TTUnsupportedFeatureError, "hidden_act"),
    ):
        changed = AutoConfig.from_pretrained(qwen_dir)
        for key, value in bad.items():
            setattr(changed, key, value)
        with pytest.raises(error, match=match):
            Qwen3_5Config.read(changed)


def test_kv_spec_through_vllms_plan_and_the_runner_layout(qwen_dir):
    """The worker's spec: a ``MambaSpec`` (one block per request) per delta-net layer and a
    ``FullAttentionSpec`` for the attention layer; vLLM plans one group per layer (equal page
    sizes: the state page is padded to the attention page), and the runner's layout gives the
    model state shapes it allocates."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
    from vllm_tt_platform.runner.kv_budget import KVBudget
    from vllm_tt_platform.runner.kv_layout import KVLayout
    from vllm_tt_testing.kv_planning import plan_kv_cache, spec_view
    from vllm_tt_testing.scheduler_sim import SimConfig, build_vllm_config

    vllm_config = build_vllm_config(SimConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=160,
                                              block_size=BLOCK))
    config = AutoConfig.from_pretrained(qwen_dir)
    spec = HostQwen3_5ForCausalLM.get_kv_cache_spec(spec_view(config, torch.float32, BLOCK, max_model_len=160))
    assert [type(s) for s in spec.values()] == [MambaSpec] * 3 + [FullAttentionSpec]
    state = spec["model.layers.0.self_attn"]
    assert isinstance(state, MambaSpec) and state.block_size == 160 and state.mamba_cache_mode == "none"
    assert state.shapes == ((256, 3), (4, 32, 32))
    plan = plan_kv_cache(vllm_config, spec, 30)
    layout = KVLayout.of(plan, 4, lambda heads: heads)
    assert sorted(g.kind for g in layout.groups) == ["full", "recurrent", "recurrent", "recurrent"]
    budget = KVBudget.plan(vllm_config, spec, 160 * 2, 2)
    assert sorted((g.kind, g.blocks) for g in budget.groups) == [
        ("full", 22), ("recurrent", 2), ("recurrent", 2), ("recurrent", 2)]
    model = build(qwen_dir)
    kv = model.allocate_kv_cache_per_layer(layout.per_layer_specs())
    assert [type(layer) for layer in kv[0]] == [RecurrentState] * 3 + [list]
    assert kv[0][0].conv.shape == (30, 256, 3) and kv[0][3][0].shape == (30, 2, BLOCK, 32)
    assert not any(g.state_boundaries for g in layout.groups)


def test_kv_spec_with_prefix_caching_keeps_a_state_per_block(qwen_dir):
    """vLLM's align mode: a ``MambaSpec`` with the attention block size, planned by vLLM into
    position-indexed recurrent groups; two state blocks per row in the budget (the last step's
    and this one's), the cached ones in the free pool."""
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm_tt_platform.runner.kv_budget import KVBudget
    from vllm_tt_platform.runner.kv_layout import KVLayout
    from vllm_tt_testing.kv_planning import plan_kv_cache, spec_view
    from vllm_tt_testing.scheduler_sim import SimConfig, build_vllm_config

    vllm_config = build_vllm_config(SimConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=160,
                                              block_size=BLOCK))
    vllm_config.cache_config.mamba_cache_mode = "align"
    view = spec_view(AutoConfig.from_pretrained(qwen_dir), torch.float32, BLOCK, max_model_len=160,
                     mamba_cache_mode="align")
    spec = HostQwen3_5ForCausalLM.get_kv_cache_spec(view)
    state = spec["model.layers.0.self_attn"]
    assert isinstance(state, MambaSpec) and (state.block_size, state.mamba_cache_mode) == (BLOCK, "align")
    layout = KVLayout.of(plan_kv_cache(vllm_config, spec, 30), 4, lambda heads: heads)
    recurrent = [g for g in layout.groups if g.recurrent]
    assert len(recurrent) == 3 and all(g.state_boundaries and g.block_size == BLOCK for g in recurrent)
    assert "recurrent(a state per 16-token block) layers [0]" in layout.describe()
    budget = KVBudget.plan(vllm_config, spec, 160 * 2, 2)
    assert sorted((g.kind, g.blocks) for g in budget.groups) == [
        ("full", 22), ("recurrent", 4), ("recurrent", 4), ("recurrent", 4)]
    # A prefix hit of 2 blocks, then 40 tokens: read the state after 32, write the one after 72.
    assert recurrent[0].state_blocks([0, 7, 0, 0, 9], 32, 72) == (7, 9)
    assert recurrent[0].state_blocks([0, 0, 9], 0, 40) == (0, 9)


def test_registered_for_the_host_backend():
    assert HOST_MODELS["TTQwen3_5ForCausalLM"].endswith("qwen3_5.model:HostQwen3_5ForCausalLM")
    caps = HostQwen3_5ForCausalLM.model_capabilities
    assert caps["kv_cache_kinds"] == ["full_attention", "recurrent_state"]
    assert caps["supports_prefix_caching"] and caps["supports_verify_decode"] and caps["supports_mtp"]


def test_prefix_caching_is_let_through_for_qwen3_5_text_and_vision_language():
    """Both declare prefix caching (their states at block boundaries); the vision-language model
    also declares ``chunked_mm_input``, which vLLM's ``align`` mode needs (chunks end on block
    boundaries, inside an image if need be)."""
    from vllm_tt_host.models.qwen3_5_vl.model import HostQwen3_5ForConditionalGeneration
    from vllm_tt_models_registry.capabilities import ModelCapabilities
    from vllm_tt_platform.config.options import TTConfig
    from vllm_tt_platform.config.startup_checks import check_capabilities

    config = TTConfig.from_sources({}, {})
    for cls, arch in ((HostQwen3_5ForCausalLM, "TTQwen3_5ForCausalLM"),
                      (HostQwen3_5ForConditionalGeneration, "TTQwen3_5ForConditionalGeneration")):
        check_capabilities(config, ModelCapabilities.of(cls), arch, async_requested=False,
                           prefix_caching_requested=True)
    assert ModelCapabilities.of(HostQwen3_5ForConditionalGeneration).chunked_mm_input


def test_speculation_runs_in_vllms_none_state_mode_with_a_slot_per_verify_position(qwen_dir, monkeypatch):
    """Speculation keeps ``1 + K`` states per request, not one per KV block: vLLM's default
    prefix caching goes off (its ``none`` state mode), the spec declares the K extra blocks,
    and an explicit ``--enable-prefix-caching`` is refused naming it."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_platform.config import cli_flags

    def config(**kwargs):
        return EngineArgs(model=str(qwen_dir), max_model_len=512, additional_config={"tt": {"mesh_backend": "host"}},
                          speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
                          **kwargs).create_engine_config()

    vllm_config = config()
    cache = vllm_config.cache_config
    assert (cache.enable_prefix_caching, cache.mamba_cache_mode) == (False, "none")
    specs = HostQwen3_5ForCausalLM.get_kv_cache_spec(vllm_config)
    assert sorted(getattr(s, "num_speculative_blocks", -1) for s in specs.values()) == [-1, 2, 2, 2]
    monkeypatch.setattr(cli_flags, "_given", {"enable_prefix_caching"})
    with pytest.raises(TTUnsupportedFeatureError, match=r"--enable-prefix-caching.*speculative-config.*Fix: remove"):
        config(enable_prefix_caching=True)


def test_prefix_caching_config_keeps_a_state_per_kv_block(qwen_dir):
    """vLLM's default turns prefix caching and its align mode on; the state blocks follow the
    TT block size (or the user's ``--block-size``); a ``--mamba-block-size`` or
    ``--prefix-match-unit`` off the block size is refused with the fix; prefix caching off
    goes back to one state block per request."""
    from vllm.engine.arg_utils import EngineArgs

    def cache(**kwargs):
        args = EngineArgs(model=str(qwen_dir), max_model_len=512, additional_config={"tt": {"mesh_backend": "host"}},
                          **kwargs)
        c = args.create_engine_config().cache_config
        return c.enable_prefix_caching, c.mamba_cache_mode, c.block_size, c.mamba_block_size

    assert cache() == (True, "align", 64, 64)
    assert cache(block_size=32) == (True, "align", 32, 32)
    assert cache(block_size=128, mamba_block_size=128) == (True, "align", 128, 128)
    assert cache(enable_prefix_caching=False) == (False, "none", 64, 512)
    with pytest.raises(TTUnsupportedFeatureError, match=r"--mamba-block-size=128.*block size \(64\).*Fix: remove"):
        cache(mamba_block_size=128)
    with pytest.raises(TTUnsupportedFeatureError, match=r"--prefix-match-unit=16.*Fix: remove --prefix-match-unit"):
        cache(prefix_match_unit=16)


# ---- verify steps (speculative decoding) -------------------------------------------

K = 3


def _states(runner, slot: int, position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per delta-net layer: the state after ``position`` of the request in ``slot`` (its ring)."""
    ring = runner.seqs[slot].tables[RECURRENT]
    block = ring[position % len(ring)]
    return [(layer.conv[block].clone(), layer.recurrent[block].clone())
            for layer in runner.kv[0] if isinstance(layer, RecurrentState)]


def _other(token: int) -> int:
    """A draft that is not ``token``."""
    return (token + 1) % 1000 + 3


def _verify_matches_hf(runner, hf_qwen, drafts: dict[int, list[int]]) -> None:
    """One verify step; every real position's logits equal transformers' over the row's history
    and drafts."""
    before = {slot: list(seq.history) for slot, seq in runner.seqs.items()}
    out = runner.verify(drafts, K)
    for slot, row in drafts.items():
        theirs = hf_all_logits(hf_qwen, before[slot] + row)[len(before[slot]) - 1 :]
        torch.testing.assert_close(out[slot, : 1 + len(row)], theirs, atol=1e-4, rtol=1e-4)


def test_verify_logits_and_the_state_after_a_partial_accept_equal_transformers(qwen_dir, hf_qwen):
    """Slot 0 drafts its true continuation with a wrong third draft (two kept, one rejected);
    slot 1's first draft is wrong (none kept), then a step keeps all three and one is a plain
    row (no drafts). Every real position's logits equal transformers' over the row's history and
    drafts; after the steps, the state the next step reads equals a plain prefill's of the same
    tokens, and further decode and verify steps stay on transformers' greedy run."""
    runner = drive(build(qwen_dir), 11, state_slots=1 + K)
    runner.add(0, prompts(21, 30)[0])
    runner.add(1, prompts(22, 17)[0])
    runner.prefill([(0, 30), (1, 17)])
    truth = {slot: hf_greedy(hf_qwen, runner.seqs[slot].history, K)[0] for slot in (0, 1)}
    wrong = {0: _other(truth[0][2]), 1: _other(truth[1][0])}
    _verify_matches_hf(runner, hf_qwen, {0: [*truth[0][:2], wrong[0]], 1: [wrong[1], *truth[1][1:]]})  # 2, 0 kept
    _verify_matches_hf(runner, hf_qwen, {0: [], 1: hf_greedy(hf_qwen, runner.seqs[1].history, K)[0]})  # -, 3 kept
    assert [len(runner.seqs[s].generated) for s in (0, 1)] == [1 + 3 + 1, 1 + 1 + 4]

    for slot in (0, 1):  # the state the next step reads: after the last kept position
        seq = runner.seqs[slot]
        plain = drive(build(qwen_dir), 12)
        plain.add(0, seq.history[:-1])
        plain.prefill([(0, len(seq.history) - 1)])
        for (conv, state), (ref_conv, ref_state) in zip(_states(runner, slot, seq.computed - 1),
                                                        _states(plain, 0, 0), strict=True):
            torch.testing.assert_close(conv, ref_conv, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-5)

    runner.decode(2)
    _verify_matches_hf(runner, hf_qwen, {0: hf_greedy(hf_qwen, runner.seqs[0].history, 2)[0], 1: [wrong[1]]})
    runner.decode(3)
    worst = max(assert_matches_hf(hf_qwen, runner.seqs[slot]) for slot in (0, 1))
    assert worst < 1e-4
    assert runner.null_block_untouched()


def test_a_next_step_reading_the_last_written_slot_goes_wrong(qwen_dir, hf_qwen):
    """The ring is what keeps a rejected draft out of the state: after slot 0 keeps none of
    three drafts, the slot its last (rejected) draft wrote holds another state than the one the
    next step reads, and generation from there stays transformers'."""
    runner = drive(build(qwen_dir), 13, state_slots=1 + K)
    runner.add(0, prompts(23, 25)[0])
    runner.prefill([(0, 25)])
    truth = hf_greedy(hf_qwen, runner.seqs[0].history, 1)[0]
    start = len(runner.seqs[0].history) - 1
    runner.verify({0: [_other(truth[0]), 5, 6]}, K)
    seq = runner.seqs[0]
    assert seq.computed == start + 1  # none kept: the bonus token only
    kept, rejected = _states(runner, 0, start), _states(runner, 0, start + K)
    assert any(not torch.allclose(a[1], b[1], atol=1e-3) for a, b in zip(kept, rejected, strict=True))
    runner.decode(2)
    assert assert_matches_hf(hf_qwen, seq) < 1e-4


# ---- the MTP module (method: mtp) ---------------------------------------------------


@pytest.fixture(scope="module")
def mtp_reference(tmp_path_factory):
    """The tiny Qwen 3.5 with a trained ``mtp.*`` module, transformers' target model of it and
    the module in transformers' modules, read back from the saved tensors (the oracle)."""
    from vllm_tt_testing.tiny_mtp import MtpHead, cached_qwen3_5_mtp

    folder = cached_qwen3_5_mtp()
    return (folder, *MtpHead.from_checkpoint(folder, tmp_path_factory.mktemp("qwen3_5-mtp-block")))


def test_mtp_drafts_match_the_module_in_transformers(mtp_reference):
    """After a prefill of two rows, ``mtp_forward`` (the module's KV on the target's attention
    blocks) drafts what vLLM's ``qwen3_5_mtp`` math gives in transformers' modules: the first
    draft from the target's hidden states at every prompt position, the chained second from the
    module's own output hidden and its first draft."""
    folder, target, head = mtp_reference
    model = build(folder)
    assert model.mtp_layers == 1
    runner = drive(model, 14)
    cfg = model.config
    assert isinstance(cfg, Qwen3_5Config)
    mtp_kv = model.allocate_mtp_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32)
    runner.add(0, _trained_text(folder, 30))
    runner.add(1, prompts(24, 17)[0])
    runner.prefill([(0, 30), (1, 17)])
    fed = [runner.seqs[slot].history[1:] for slot in (0, 1)]
    feed = torch.zeros(2, max(map(len, fed)), dtype=torch.int32)
    for slot, row in enumerate(fed):
        feed[slot, : len(row)] = torch.tensor(row)
    attention = runner.page_tables([0, 1], WIDTH)[cfg.layer_kinds.index("full_attention")]
    drafts = model.mtp_forward(tokens=feed, start_pos=torch.zeros(2, dtype=torch.int32),
                               num_valid_tokens=torch.tensor([len(f) for f in fed]), page_table=attention,
                               kv_cache=mtp_kv, num_drafts=2)
    for slot in (0, 1):
        assert drafts[slot].tolist() == head.greedy_drafts(target, runner.seqs[slot].prompt, fed[slot], 2), slot


def test_a_checkpoint_declaring_mtp_without_its_weights_is_refused(qwen_dir, tmp_path):
    """``mtp_num_hidden_layers: 1`` without ``mtp.*`` tensors: the model has no module, and the
    runner's drafter and the module's KV are refused by the setting."""
    import json
    from types import SimpleNamespace

    from vllm_tt_platform.runner.mtp import MtpDrafts

    for path in qwen_dir.iterdir():
        if path.is_file() and not path.name.startswith("."):
            (tmp_path / path.name).symlink_to(path)
    config = json.loads((qwen_dir / "config.json").read_text()) | {"mtp_num_hidden_layers": 1}
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = build(tmp_path)
    assert model.mtp_layers == 0
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(model="tiny-qwen3_5", max_model_len=WIDTH * BLOCK),
                                  cache_config=SimpleNamespace(block_size=BLOCK))
    with pytest.raises(TTConfigError, match="--speculative-config method"):
        MtpDrafts(vllm_config, model, None, 1, 2)  # type: ignore[arg-type]
    with pytest.raises(TTConfigError, match="--speculative-config method"):
        model.allocate_mtp_kv_cache((NUM_BLOCKS, model.config.num_kv_heads, BLOCK, model.config.head_dim),
                                    torch.float32)
