"""Host reference models against transformers, driven through the TT model contract the way
the model runner drives them: paged KV from a shuffled free list, whole histories in prefill
(chunks and prefix hits with ``start_pos > 0``), full fixed-batch decode with padding rows."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.device import HostMeshDevice, TraceNotCapturedError
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.families import (
    HostLlamaForCausalLM,
    HostMistralForCausalLM,
    HostQwen2ForCausalLM,
    HostQwen3ForCausalLM,
)
from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.models.frame.shapes import HostModelInputError, PrefillTooLongError, TraceKey
from vllm_tt_host.models.gemma3.model import HostGemma3ForCausalLM
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.contract_driver import ContractDriver
from vllm_tt_testing.parity import assert_matches_hf, prompts

MODEL_CLASSES: dict[str, type[HostCausalLM]] = {
    "llama": HostLlamaForCausalLM,
    "mistral": HostMistralForCausalLM,
    "qwen2": HostQwen2ForCausalLM,
    "qwen3": HostQwen3ForCausalLM,
    "gemma3": HostGemma3ForCausalLM,
}
BLOCK = 16
NUM_BLOCKS = 64
WIDTH = 24
"""Page-table width (blocks per row)."""
MAX_SEQ = WIDTH * BLOCK


def build(tiny_checkpoint, arch: str, batch: int = 4, lanes: int = 1, max_seq: int = MAX_SEQ):
    mesh = HostMeshDevice(MeshShape(lanes, 1))
    config = AutoConfig.from_pretrained(tiny_checkpoint(arch))
    model = MODEL_CLASSES[arch].initialize_vllm_model(
        config, mesh, batch, max_seq, tt_data_parallel=lanes, optimizations=None
    )
    return model, mesh


def drive(model: HostCausalLM, seed: int = 0) -> ContractDriver:
    """The runner's side of the single-table contract over one paged KV cache."""
    cfg = model.config
    kv = model.allocate_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)
    return ContractDriver(model, kv, width=WIDTH, seed=seed)


@pytest.mark.parametrize("arch", sorted(MODEL_CLASSES))
def test_greedy_parity_with_transformers(arch, tiny_checkpoint, hf_reference):
    model, _ = build(tiny_checkpoint, arch)
    runner = drive(model, seed=1)
    short, long, own = prompts(0, 7, 200, 13)
    runner.add(0, short)
    runner.add(2, long)
    # Step 1: a whole short prompt and the first bucket-sized chunk of a long one.
    runner.prefill([(0, 7), (2, 128)])
    # Step 2: the long prompt's last chunk (start_pos 128) and a prefix-cache hit that reuses
    # the long prompt's first two blocks (start_pos 32).
    runner.add(3, long[:32] + own, prefix_of=2, cached_blocks=2)
    runner.prefill([(2, 200), (3, 45)])
    runner.decode(8, enable_trace=False, read_from_device=False)  # slot 1 is a padding row throughout

    hf = hf_reference(arch)
    for slot in (0, 2, 3):
        assert_matches_hf(hf, runner.seqs[slot])
    for k_cache, v_cache in runner.kv[0]:  # padding rows point at block 0 and never write it
        assert not k_cache[0].any() and not v_cache[0].any()


def test_lanes_keep_separate_kv_caches(tiny_checkpoint, hf_reference):
    model, mesh = build(tiny_checkpoint, "qwen3", batch=4, lanes=2)
    assert [d.lane for d in model.lanes.devices] == [0, 1]
    assert [d.shape for d in model.lanes.devices] == [(1, 1), (1, 1)]
    runner = drive(model, seed=2)
    assert len(runner.kv) == 2
    first, second = prompts(1, 20, 27)
    runner.add(0, first)  # lane 0
    runner.add(2, second)  # lane 1, handed the same block ids as lane 0
    runner.prefill([(0, 20)])
    assert all(not t.any() for layer in runner.kv[1] for t in layer)  # lane 1 untouched
    runner.prefill([(2, 27)])
    assert runner.seqs[0].tables == runner.seqs[2].tables
    runner.decode(6, enable_trace=False, read_from_device=False)
    hf = hf_reference("qwen3")
    assert_matches_hf(hf, runner.seqs[0])
    assert_matches_hf(hf, runner.seqs[2])


def test_lanes_need_equal_batches(tiny_checkpoint):
    with pytest.raises(TTConfigError, match="max_batch_size"):
        build(tiny_checkpoint, "qwen3", batch=3, lanes=2)


def test_decode_rejects_a_partial_batch(tiny_checkpoint):
    model, _ = build(tiny_checkpoint, "mistral")
    kv = drive(model).kv
    with pytest.raises(HostModelInputError, match="full fixed batch of 4"):
        model.decode_forward(
            tokens=torch.zeros(3, 1, dtype=torch.int32),
            start_pos=torch.zeros(3, dtype=torch.int32),
            page_table=torch.zeros(3, WIDTH, dtype=torch.int32),
            kv_cache=kv,
        )


def test_traces_must_be_captured_by_warmup(tiny_checkpoint):
    model, mesh = build(tiny_checkpoint, "mistral", lanes=2, max_seq=256)
    runner = drive(model)
    runner.add(0, prompts(2, 10)[0])
    with pytest.raises(TraceNotCapturedError):
        runner.prefill([(0, 10)], enable_trace=True)
    decode_args = dict(
        tokens=torch.zeros(4, 1, dtype=torch.int32),
        start_pos=torch.full((4,), -1, dtype=torch.int32),
        page_table=torch.zeros(4, WIDTH, dtype=torch.int32),
        kv_cache=runner.kv,
        enable_trace=True,
    )
    with pytest.raises(TraceNotCapturedError):
        model.decode_forward(**decode_args)

    # Compile pass (no traces), then capture pass, as the runner's warmup does.
    for enable_trace in (False, True):
        model.warmup_model_prefill(kv_cache=runner.kv, enable_trace=enable_trace, can_sample_on_device=False)
        model.warmup_model_decode(
            kv_cache=runner.kv,
            enable_trace=enable_trace,
            max_batch_size=4,
            num_blocks=WIDTH,
            can_sample_on_device=False,
            unknown_future_kwarg=1,
        )
        if not enable_trace:
            assert not any(d.captured_traces for d in model.lanes.devices)
    expected = {TraceKey.prefill(128), TraceKey.prefill(1024), TraceKey.decode(2, False)}
    assert [d.captured_traces for d in model.lanes.devices] == [expected, expected]
    assert not mesh.captured_traces  # lanes trace on their own sub-mesh

    runner.prefill([(0, 10)], enable_trace=True)
    model.decode_forward(**decode_args)
    sampling = types.SimpleNamespace(enable_log_probs=[False] * 4)  # never reaches the sampler
    with pytest.raises(TraceNotCapturedError, match="sampling"):
        model.decode_forward(**decode_args, sampling_params=sampling)


def test_warmup_decode_checks_the_batch(tiny_checkpoint):
    model, _ = build(tiny_checkpoint, "mistral")
    with pytest.raises(HostModelInputError, match="max_batch_size=8"):
        model.warmup_model_decode(
            kv_cache=drive(model).kv,
            enable_trace=True,
            max_batch_size=8,
            num_blocks=WIDTH,
            can_sample_on_device=False,
        )


def test_prefill_longer_than_largest_bucket_is_an_error(tiny_checkpoint):
    model, _ = build(tiny_checkpoint, "qwen2", max_seq=8192)
    kv = model.allocate_kv_cache((8, 2, 1024, model.config.head_dim), torch.float32, 2)
    with pytest.raises(PrefillTooLongError, match="largest prefill bucket 4096"):
        model.prefill_forward(
            tokens=torch.zeros(1, 5000, dtype=torch.int32),
            page_table=torch.arange(8, dtype=torch.int32)[None],
            kv_cache=kv,
            prompt_lens=[5000],
        )


def test_prefill_rejects_bad_rows(tiny_checkpoint):
    model, _ = build(tiny_checkpoint, "qwen2")
    runner = drive(model)
    args = dict(tokens=torch.zeros(1, 20, dtype=torch.int32), kv_cache=runner.kv)
    with pytest.raises(HostModelInputError, match="start_pos"):
        model.prefill_forward(
            **args, page_table=torch.ones(1, WIDTH, dtype=torch.int32), prompt_lens=[20], start_pos=[20]
        )
    with pytest.raises(HostModelInputError, match="outside the 64 KV blocks"):
        model.prefill_forward(
            **args, page_table=torch.full((1, WIDTH), 99, dtype=torch.int32), prompt_lens=[20]
        )
    with pytest.raises(HostModelInputError, match="slot 4"):
        model.prefill_forward(
            **args, page_table=torch.ones(1, WIDTH, dtype=torch.int32), prompt_lens=[20], empty_slots=[4]
        )


def test_kv_cache_layout(tiny_checkpoint):
    model, _ = build(tiny_checkpoint, "qwen3", lanes=2)
    head_dim = model.config.head_dim
    # A shape carrying one device's share of the kv heads still gets all heads on the host.
    kv = model.allocate_kv_cache((10, 1, BLOCK, head_dim), torch.bfloat16, 2)
    assert len(kv) == 2 and len(kv[0]) == 2 and len(kv[0][0]) == 2
    assert kv[1][1][0].shape == (10, 2, BLOCK, head_dim) and kv[1][1][0].dtype == torch.float32
    assert kv[0][0][0].data_ptr() != kv[1][0][0].data_ptr()
    with pytest.raises(HostModelInputError, match="head_dim 48"):
        model.allocate_kv_cache((10, 2, BLOCK, 32), torch.float32, 2)
    with pytest.raises(HostModelInputError, match="2 layers"):
        model.allocate_kv_cache((10, 2, BLOCK, head_dim), torch.float32, 3)


def test_max_tokens_all_users_is_every_lane_row_at_full_length():
    # The runner passes one lane's rows (runner.kv_blocks_wanted).
    assert HostQwen3ForCausalLM.get_max_tokens_all_users("m", 2, 2, 1024, 3) == 1024 * 3
    assert (
        HostLlamaForCausalLM.get_max_tokens_all_users(
            model_name="m", num_devices=1, tt_data_parallel=1, max_model_len=512, max_num_seqs=3
        )
        == 1536
    )
    with pytest.raises(TTConfigError, match="max_num_seqs"):
        HostLlamaForCausalLM.get_max_tokens_all_users("m", 1, 1, 512, 0)


def test_n_layers_truncates_and_optimizations_are_checked(tiny_checkpoint):
    config = AutoConfig.from_pretrained(tiny_checkpoint("llama"))
    mesh = HostMeshDevice(MeshShape(1, 1))
    model = HostLlamaForCausalLM.initialize_vllm_model(config, mesh, 2, 64, n_layers=1)
    assert model.config.num_layers == 1 and len(model.decoder.weights.layers) == 1
    with pytest.raises(TTConfigError, match="optimizations"):
        HostLlamaForCausalLM.initialize_vllm_model(config, mesh, 2, 64, optimizations="fast")


def test_sliding_window_is_refused(tiny_checkpoint):
    mesh = HostMeshDevice(MeshShape(1, 1))
    config = AutoConfig.from_pretrained(tiny_checkpoint("mistral"))
    config.sliding_window = 4096
    with pytest.raises(TTUnsupportedFeatureError, match="sliding_window=4096"):
        HostMistralForCausalLM.initialize_vllm_model(config, mesh, 2, 64)
    qwen = AutoConfig.from_pretrained(tiny_checkpoint("qwen2"))
    qwen.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(TTUnsupportedFeatureError, match="sliding_window"):
        HostQwen2ForCausalLM.initialize_vllm_model(qwen, mesh, 2, 64)


def test_capabilities_and_registry_table():
    from vllm_tt_models_registry.contract import check_model_class

    for cls in MODEL_CLASSES.values():
        assert check_model_class(cls, owner="host").supports_sample_on_device
        caps = cls.model_capabilities
        assert caps["supports_sample_on_device"] and caps["supports_prefix_caching"]
        assert caps["supports_async_decode"] and caps["single_program_lanes"]
        assert caps["prefill_trace_lens"] == [128, 1024, 2048, 4096]
    for arch, cls in MODEL_CLASSES.items():
        tt_name = {
            "llama": "TTLlamaForCausalLM",
            "mistral": "TTMistralForCausalLM",
            "qwen2": "TTQwen2ForCausalLM",
            "qwen3": "TTQwen3ForCausalLM",
            "gemma3": "TTGemma3ForCausalLM",
        }[arch]
        module, name = HOST_MODELS[tt_name].split(":")
        assert getattr(__import__(module, fromlist=[name]), name) is cls


def test_device_sampling_greedy_returns_argmax_tokens(tiny_checkpoint):
    from vllm_tt_sampling.params import TTSamplingParams

    model, _ = build(tiny_checkpoint, "qwen3")
    logits_run, sampled_run = drive(model, seed=3), drive(model, seed=3)
    prompt = prompts(3, 30)[0]
    for runner in (logits_run, sampled_run):
        runner.add(1, prompt)
    logits = logits_run.prefill([(1, 30)])
    tokens = sampled_run.prefill([(1, 30)], sampling_params=TTSamplingParams.neutral(1))
    assert tokens.dtype == torch.int64 and tokens.tolist() == [int(logits[0, -1].argmax())]

    logits_run.decode(1, enable_trace=False, read_from_device=False)  # decodes the argmax token, as sampled_run will
    rows = model.max_batch_size
    start = torch.full((rows,), -1, dtype=torch.int32)
    start[1] = 30
    inputs = torch.zeros(rows, 1, dtype=torch.int32)
    inputs[1, 0] = tokens[0]
    table = torch.zeros(rows, WIDTH, dtype=torch.int32)
    table[1, : len(sampled_run.seqs[1].tables[None])] = torch.tensor(sampled_run.seqs[1].tables[None])
    params = TTSamplingParams.neutral(rows)
    params = TTSamplingParams(**{**vars(params), "enable_log_probs": [False, True, False, False]})
    out, logprobs = model.decode_forward(
        tokens=inputs,
        start_pos=start,
        page_table=table,
        kv_cache=sampled_run.kv,
        sampling_params=params,
    )
    assert out.shape == (rows,) and int(out[1]) == logits_run.seqs[1].generated[-1]
    expected = torch.log_softmax(logits_run.seqs[1].logits[-1], dim=-1)[out[1]]
    torch.testing.assert_close(logprobs[1], expected, atol=1e-5, rtol=1e-5)


def test_sharded_checkpoint_loads_the_same_model(tiny_checkpoint, tmp_path, hf_reference):
    hf = hf_reference("mistral")
    hf.save_pretrained(tmp_path, max_shard_size="500KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    config = AutoConfig.from_pretrained(tiny_checkpoint("mistral"))
    config._name_or_path = str(tmp_path)
    sharded = HostMistralForCausalLM.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), 2, 64)
    original, _ = build(tiny_checkpoint, "mistral")
    for ours, theirs in zip(
        (sharded.decoder.weights.embed, sharded.decoder.weights.layers[1].mlp.down),
        (original.decoder.weights.embed, original.decoder.weights.layers[1].mlp.down),
        strict=True,
    ):
        assert torch.equal(ours, theirs)


def test_missing_tensor_and_missing_folder_are_named(tiny_checkpoint, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file
    from vllm_tt_host.models.frame.checkpoint import CheckpointError

    folder = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint("qwen3"), folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, folder / "model.safetensors")
    config = AutoConfig.from_pretrained(folder)
    mesh = HostMeshDevice(MeshShape(1, 1))
    with pytest.raises(CheckpointError, match="k_norm"):
        HostQwen3ForCausalLM.initialize_vllm_model(config, mesh, 2, 64)
    config._name_or_path = "nobody/not-cached"
    with pytest.raises(CheckpointError, match="never download"):
        HostQwen3ForCausalLM.initialize_vllm_model(config, mesh, 2, 64)


def test_repo_id_resolves_to_its_local_hub_snapshot(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from vllm_tt_host.models.frame.checkpoint import resolve_checkpoint_dir

    repo = tmp_path / "models--acme--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_checkpoint_dir("acme/tiny") == snapshot


def test_legacy_rope_fields_and_unsupported_rope(tiny_checkpoint):
    from vllm_tt_host.models.frame.config import DecoderConfig

    base = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=100,
        intermediate_size=128,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
    )
    legacy = types.SimpleNamespace(
        **base,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    config = DecoderConfig.read(legacy, "llama")
    assert config.rope.rope_type == "llama3" and config.rope.theta == 500000.0
    assert config.head_dim == 16 and config.kv_groups == 2 and not config.qkv_bias
    assert DecoderConfig.read(types.SimpleNamespace(**base), "qwen2").qkv_bias
    yarn = types.SimpleNamespace(**base, rope_theta=1e6, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(TTUnsupportedFeatureError, match="rope_type='yarn'"):
        DecoderConfig.read(yarn, "qwen3")
    gelu = types.SimpleNamespace(**base, hidden_act="gelu")
    with pytest.raises(TTUnsupportedFeatureError, match="hidden_act"):
        DecoderConfig.read(gelu, "llama")


def test_llama3_frequencies_match_transformers(tiny_checkpoint):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from vllm_tt_host.models.frame.config import DecoderConfig
    from vllm_tt_host.models.frame.rope import inverse_frequencies

    hf_config = AutoConfig.from_pretrained(tiny_checkpoint("llama"))
    config = DecoderConfig.read(hf_config, "llama")
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    ours = inverse_frequencies(config.rope, config.head_dim)
    assert torch.equal(ours, theirs)
    # All three bands are exercised: kept, stretched by `factor`, and blended.
    plain = inverse_frequencies(dataclasses.replace(config.rope, rope_type="default"), config.head_dim)
    ratio = plain / ours
    assert (ratio == 1).any() and (ratio == 8).any() and ((ratio > 1) & (ratio < 8)).any()


def test_classes_show_vllm_the_text_generation_surface():
    """What vLLM's ``is_text_generation_model`` inspects (importing vLLM here would cost ~15 s;
    the end-to-end tests cover the real check)."""
    import inspect

    for cls in MODEL_CLASSES.values():
        assert "vllm_config" in inspect.signature(cls.__init__).parameters
        assert {"input_ids", "positions"} <= set(inspect.signature(cls.forward).parameters)
        assert callable(cls.embed_input_ids) and callable(cls.compute_logits)
    with pytest.raises(NotImplementedError, match="prefill_forward/decode_forward"):
        HostQwen3ForCausalLM.compute_logits(None, torch.zeros(1))
    with pytest.raises(TypeError, match="initialize_vllm_model"):
        HostQwen3ForCausalLM(None, None, 0, vllm_config=object())


def test_reading_host_models_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, vllm_tt_host.models as m; print(len(m.HOST_MODELS), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(HOST_MODELS)), "False"]


@pytest.mark.parametrize("tower", ["siglip", "pixtral"])
def test_a_vision_activation_the_host_tower_lacks_is_refused(tower):
    from vllm_tt_host.models.gemma3.siglip import SiglipConfig
    from vllm_tt_host.models.mistral3.pixtral import PixtralConfig

    config_cls = {"siglip": SiglipConfig, "pixtral": PixtralConfig}[tower]
    vision = types.SimpleNamespace(_name_or_path="tiny-vl", hidden_act="quick_gelu")
    with pytest.raises(TTUnsupportedFeatureError, match=r"tiny-vl: vision_config.hidden_act.*quick_gelu"):
        config_cls.from_hf(vision)


def test_pooling_in_lanes_runs_each_lanes_rows_on_its_sub_mesh(tiny_checkpoint):
    """A pooling call of ``lanes x batch`` rows runs ``batch`` rows on each lane's sub-mesh
    (each replaying its own trace): the rows' hidden states equal one lane's, row for row."""
    one, _ = build(tiny_checkpoint, "qwen3", batch=2)
    two, mesh = build(tiny_checkpoint, "qwen3", batch=4, lanes=2)
    two.warmup_model_pool(shapes=[(2, 32)], enable_trace=True)
    assert all(TraceKey.pool(2, 32) in lane.captured_traces for lane in two.lanes.devices)
    tokens = torch.randint(3, one.config.vocab_size, (4, 32))
    lens = torch.tensor([32, 5, 0, 17])
    got = two.pool_forward(tokens=tokens, prompt_lens=lens, enable_trace=True)
    for row in range(4):
        alone = one.pool_forward(tokens=tokens[row: row + 1], prompt_lens=lens[row: row + 1])
        torch.testing.assert_close(got[row], alone[0])
    with pytest.raises(TraceNotCapturedError):
        two.pool_forward(tokens=tokens[:, :16], prompt_lens=lens.clamp(max=16), enable_trace=True)
    with pytest.raises(HostModelInputError, match="does not split into 2 lanes"):
        two.pool_forward(tokens=tokens[:3], prompt_lens=lens[:3])
    mesh.close()
