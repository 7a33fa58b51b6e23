"""Bad configurations reach the user as typed TT errors naming the setting, before any device
is opened or weights are loaded (building vLLM's config is all these tests do)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

HOST = {"tt": {"mesh_backend": "host"}}


def _host(**tt):
    return {"tt": {"mesh_backend": "host", **tt}}


@pytest.fixture(scope="module")
def llama(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")


@pytest.fixture
def no_device_sampling_bundle(tmp_path, monkeypatch) -> None:
    """A bundle serving Llama checkpoints with a model that cannot sample on device."""
    bundle = tmp_path / "bundles" / "plain_llama"
    bundle.mkdir(parents=True)
    (bundle / "vllm_metadata.json").write_text(
        json.dumps({"arch": "LlamaForCausalLM", "main_class": "plain_llama_adapter:PlainLlama"})
    )
    (bundle / "plain_llama_adapter.py").write_text(
        textwrap.dedent("""
        from vllm_tt_host.models.families import HostLlamaForCausalLM

        class PlainLlama(HostLlamaForCausalLM):
            model_capabilities = {"supports_prefix_caching": True}
    """)
    )
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tmp_path / "bundles"))


CASES = [
    # (id, engine args, env, error type, setting named in the message)
    ("tp", {"tensor_parallel_size": 2}, {}, TTUnsupportedFeatureError, "--tensor-parallel-size"),
    ("pp", {"pipeline_parallel_size": 2}, {}, TTUnsupportedFeatureError, "--pipeline-parallel-size"),
    ("lora", {"enable_lora": True}, {}, TTUnsupportedFeatureError, "--enable-lora"),
    ("sleep-mode", {"enable_sleep_mode": True}, {}, TTUnsupportedFeatureError, "--enable-sleep-mode"),
    # KV offloading (tests/e2e/test_kv_offload.py) and the shared-storage connector
    # (tests/e2e/test_disagg_serve.py) are served; every other connector is refused by name
    ("kv-transfer", {"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}}, {},
     TTUnsupportedFeatureError, "LMCacheConnectorV1"),
    ("kv-shared-chunked", {"kv_transfer_config": {"kv_connector": "ExampleConnector", "kv_role": "kv_producer"}}, {},
     TTUnsupportedFeatureError, "--no-enable-chunked-prefill"),
    ("kv-shared-recompute", {"kv_transfer_config": {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer",
                                                    "kv_load_failure_policy": "recompute"}}, {},
     TTUnsupportedFeatureError, "kv_load_failure_policy"),
    ("kv-shared-module", {"kv_transfer_config": {
        "kv_connector": "ExampleConnector", "kv_role": "kv_consumer",
        "kv_connector_module_path": "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"}}, {},
     TTUnsupportedFeatureError, "kv_connector_module_path"),
    ("kv-nixl", {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}}, {},
     TTUnsupportedFeatureError, "NixlConnector"),
    ("kv-lmcache", {"kv_offloading_size": 1.0, "kv_offloading_backend": "lmcache"}, {},
     TTUnsupportedFeatureError, "LMCacheMPConnector"),
    ("kv-simple-offload", {"kv_offloading_size": 1.0}, {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"},
     TTUnsupportedFeatureError, "SimpleCPUOffloadConnector"),
    ("kv-offload-spec", {"kv_transfer_config": {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                                "kv_connector_extra_config": {"spec_name": "CPUOffloadingSpec"}}},
     {}, TTUnsupportedFeatureError, "spec_name"),
    # its own additional_config: folding -dp into lanes writes the lane shape into it
    ("kv-offload-lanes", {"kv_offloading_size": 1.0, "data_parallel_size": 2, "additional_config": _host()},
     {"MESH_DEVICE": "N300"},
     TTUnsupportedFeatureError, "--kv-offloading-size with lanes"),
    # a decoder pools as an embedding model; a classifier is its own architecture (--hf-overrides)
    ("pooling-convert", {"runner": "pooling", "convert": "classify"}, {}, TTUnsupportedFeatureError, "--convert"),
    # --convert alone: vLLM turns it into --runner pooling first, the error still names --convert
    ("convert-alone", {"convert": "classify"}, {}, TTUnsupportedFeatureError, "--convert"),
    ("ray-dp", {"data_parallel_backend": "ray"}, {}, TTUnsupportedFeatureError, "--data-parallel-backend"),
    # mixed steps: no verify or block steps beside them (docs/scheduling.md#mixed-steps)
    ("mixed-spec", {"additional_config": _host(mixed_steps=True),
                    "speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}},
     {}, TTUnsupportedFeatureError, "--additional-config.tt.mixed_steps=True is not supported"),
    ("mixed-block", {"additional_config": _host(mixed_steps=True, block_tokens=4)}, {},
     TTUnsupportedFeatureError, "false with --additional-config.tt.block_tokens 4"),
    # the SLO-aware chunk policy sizes mixed chunks by the step cost model's time
    ("itl-slo-alone", {"additional_config": _host(itl_slo_ms=50.0)}, {},
     TTUnsupportedFeatureError, "0 without tt.mixed_steps and tt.step_cost"),
    ("itl-slo-no-cost", {"additional_config": _host(mixed_steps=True, itl_slo_ms=50.0)}, {},
     TTUnsupportedFeatureError, "0 without tt.step_cost"),
    (  # n-gram speculation is served (tests/e2e/test_spec_decode.py); other methods are refused
        "spec-method",
        {"speculative_config": {"method": "ngram_gpu", "num_speculative_tokens": 2, "prompt_lookup_max": 2}},
        {},
        TTUnsupportedFeatureError,
        "--speculative-config method",
    ),
    (
        "prompt-embeds",
        {"enable_prompt_embeds": True},
        {},
        TTUnsupportedFeatureError,
        "--enable-prompt-embeds",
    ),
    ("block-size", {"block_size": 16}, {}, TTConfigError, "--block-size"),
    # accepted by vLLM, not implemented on TT: refused by name instead of ignored (config.unimplemented)
    ("dbo", {"enable_dbo": True}, {}, TTUnsupportedFeatureError, "--enable-dbo"),
    ("cpu-offload", {"cpu_offload_gb": 1}, {}, TTUnsupportedFeatureError, "--cpu-offload-gb"),
    ("routed-experts", {"enable_return_routed_experts": True}, {}, TTUnsupportedFeatureError,
     "--enable-return-routed-experts"),
    ("eager-and-traces", {"enforce_eager": True, "additional_config": _host(trace_mode="all")}, {},
     TTConfigError, "--additional-config.tt.trace_mode"),
    (
        "v2-runner",
        {},
        {"VLLM_USE_V2_MODEL_RUNNER": "1"},
        TTUnsupportedFeatureError,
        "VLLM_USE_V2_MODEL_RUNNER",
    ),
    ("target-device", {}, {"VLLM_TARGET_DEVICE": "cuda"}, TTConfigError, "VLLM_TARGET_DEVICE"),
    ("mesh-device", {}, {"MESH_DEVICE": "N999"}, TTConfigError, "MESH_DEVICE"),
    ("mesh-shape", {}, {"MESH_DEVICE": "(0,4)"}, TTConfigError, "MESH_DEVICE"),
    ("backend-env", {"additional_config": {}}, {"TT_MESH_BACKEND": "gpu"}, TTConfigError, "TT_MESH_BACKEND"),
    (
        "unknown-key",
        {"additional_config": _host(trace_mod="all")},
        {},
        TTConfigError,
        "--additional-config.tt.trace_mod",
    ),
    ("tt-not-object", {"additional_config": {"tt": "host"}}, {}, TTConfigError, "--additional-config.tt"),
    (
        "sampling-mode",
        {"additional_config": _host(sample_on_device_mode="sometimes")},
        {},
        TTConfigError,
        "--additional-config.tt.sample_on_device_mode",
    ),
    (
        "compat-type",
        {"additional_config": _host(always_compat_sampling="yes please")},
        {},
        TTConfigError,
        "--additional-config.tt.always_compat_sampling",
    ),
    (
        "trace-mode",
        {"additional_config": _host(trace_mode="prefill_only")},
        {},
        TTConfigError,
        "--additional-config.tt.trace_mode",
    ),
    (
        "trace-no-warmup",
        {"additional_config": _host(enable_model_warmup=False)},
        {},
        TTConfigError,
        "--additional-config.tt.enable_model_warmup",
    ),
    (
        "trace-region",
        {"additional_config": _host(trace_region_size=-5)},
        {},
        TTConfigError,
        "--additional-config.tt.trace_region_size",
    ),
    (
        "fabric",
        {"additional_config": _host(fabric_config="FABRIC_9D")},
        {},
        TTConfigError,
        "--additional-config.tt.fabric_config",
    ),
    (
        "dispatch-axis",
        {"additional_config": _host(dispatch_core_axis="z")},
        {},
        TTConfigError,
        "--additional-config.tt.dispatch_core_axis",
    ),
    (
        "optimizations",
        {"additional_config": _host(optimizations="fast")},
        {},
        TTConfigError,
        "--additional-config.tt.optimizations",
    ),
    (
        "prefill-burst",
        {"additional_config": _host(prefill_burst=0)},
        {},
        TTConfigError,
        "--additional-config.tt.prefill_burst",
    ),
    (
        "l1-small",
        {"additional_config": _host(l1_small_size="lots")},
        {},
        TTConfigError,
        "--additional-config.tt.l1_small_size",
    ),
]


@pytest.mark.parametrize(
    ("args", "env", "error", "setting"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_configuration(llama, monkeypatch, args, env, error, setting):
    from vllm.engine.arg_utils import EngineArgs

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    kwargs = {"additional_config": HOST, **args}
    with pytest.raises(error) as info:
        EngineArgs(model=str(llama), max_model_len=256, **kwargs).create_engine_config()
    assert setting in str(info.value)
    assert "Fix:" in str(info.value)


def test_enforce_eager_is_trace_mode_none_and_chunked_prefill_off_is_kept(llama):
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(llama), max_model_len=256, max_num_batched_tokens=256, enforce_eager=True,
                        enable_chunked_prefill=False, additional_config=_host()).create_engine_config()
    assert config.additional_config["tt"]["trace_mode"] == "none"
    assert config.scheduler_config.enable_chunked_prefill is False
    default = EngineArgs(model=str(llama), max_model_len=256, additional_config=_host()).create_engine_config()
    assert "trace_mode" not in default.additional_config["tt"]
    assert default.scheduler_config.enable_chunked_prefill is True


def test_device_sampling_needs_the_model_capability(llama, no_device_sampling_bundle):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(llama), max_model_len=256, additional_config=_host(sample_on_device_mode="all")
    )
    with pytest.raises(TTUnsupportedFeatureError) as info:
        args.create_engine_config()
    assert "--additional-config.tt.sample_on_device_mode" in str(info.value)
    assert "supports_sample_on_device" in str(info.value)


@pytest.mark.parametrize(("runner", "convert", "caps", "setting"), [
    ("pooling", "embed", {}, "--runner"),  # a generation model without supports_pooling
    ("generate", "none", {"pooling_model": True}, "--runner"),  # an encoder only pools
    ("pooling", "classify", {"supports_pooling": True}, "--convert"),  # a decoder has no classifier head
    ("pooling", "embed", {"pooling_model": True, "pooled_outputs": True}, "--convert"),  # a reranker's scores
])
def test_runner_and_convert_need_the_model_capability(runner, convert, caps, setting):
    from types import SimpleNamespace

    from vllm_tt_models_registry.contract import ModelCapabilities
    from vllm_tt_platform.config.startup_checks import check_runner

    config = SimpleNamespace(model_config=SimpleNamespace(runner_type=runner, convert_type=convert))
    with pytest.raises(TTUnsupportedFeatureError) as info:
        check_runner(config, ModelCapabilities(**caps), "TTSomeModel")  # type: ignore[arg-type]
    assert setting in str(info.value) and "Fix:" in str(info.value)


def test_a_decoder_pools_prefill_only(llama):
    """``--runner pooling`` on a decoder: whole prompts in one step, no decode to overlap."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(llama), max_model_len=256, runner="pooling", convert="embed",
                        additional_config=HOST).create_engine_config()
    assert config.model_config.hf_config.architectures == ["TTLlamaForCausalLM"]
    assert config.scheduler_config.enable_chunked_prefill is False
    assert config.scheduler_config.async_scheduling is False
    assert config.scheduler_config.scheduler_cls == "vllm_tt_scheduler.TTScheduler"


def test_good_configuration_is_rewritten_for_tt(llama):
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST).create_engine_config()
    assert config.model_config.hf_config.architectures == ["TTLlamaForCausalLM"]
    assert config.parallel_config.worker_cls == "vllm_tt_platform.worker.TTWorker"
    # The host models declare supports_async_decode: vLLM's default (async on) is kept.
    assert config.scheduler_config.scheduler_cls == "vllm_tt_scheduler.TTAsyncScheduler"
    assert config.cache_config.block_size == 64
    assert config.scheduler_config.async_scheduling is True


def test_kv_offloading_selects_the_tt_transfer_handler(llama):
    """``--kv-offloading-size`` keeps vLLM's OffloadingConnector and points it at the TT spec."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_platform.config.kv_transfer import SPEC_KEYS

    config = EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST,
                        kv_offloading_size=0.5).create_engine_config()
    kv = config.kv_transfer_config
    assert kv is not None and kv.kv_connector == "OffloadingConnector" and kv.kv_role == "kv_both"
    assert {**kv.kv_connector_extra_config, "cpu_bytes_to_use": None} == {**SPEC_KEYS, "cpu_bytes_to_use": None}
    assert kv.kv_connector_extra_config["cpu_bytes_to_use"] == 0.5 * (1 << 30)


def test_shared_storage_connector_selects_the_tt_worker_side(llama, tmp_path):
    """``--kv-transfer-config`` with vLLM's ExampleConnector keeps its name and scheduler side;
    the factory builds the TT subclass, and vLLM turns the hybrid KV manager off for it."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_platform.config.kv_transfer import CONNECTOR_MODULES

    for role, chunked in (("kv_producer", False), ("kv_both", False), ("kv_consumer", True)):
        kv_config = {"kv_connector": "ExampleConnector", "kv_role": role,
                     "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
        config = EngineArgs(model=str(llama), max_model_len=256, max_num_batched_tokens=256, additional_config=HOST,
                            enable_chunked_prefill=chunked, kv_transfer_config=kv_config).create_engine_config()
        kv = config.kv_transfer_config
        assert kv is not None and kv.kv_connector_module_path == CONNECTOR_MODULES["ExampleConnector"]
        cls = KVConnectorFactory.get_connector_class(kv)
        assert cls.__module__ == CONNECTOR_MODULES["ExampleConnector"] and issubclass(cls, ExampleConnector)
        assert config.scheduler_config.disable_hybrid_kv_cache_manager is True
        assert config.scheduler_config.enable_chunked_prefill is chunked


def test_a_refused_connector_is_told_what_is_served(llama):
    from vllm.engine.arg_utils import EngineArgs

    kv_config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    with pytest.raises(TTUnsupportedFeatureError) as info:
        EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST,
                   kv_transfer_config=kv_config).create_engine_config()
    message = str(info.value)
    assert "NixlConnector" in message and "OffloadingConnector" in message and "ExampleConnector" in message


@pytest.mark.parametrize(("caps", "refused"), [
    ({"kv_cache_kinds": ("full_attention", "recurrent_state")}, "recurrent_state"),  # Qwen 3.5's gated delta-net
    ({"kv_cache_kinds": ("full_attention", "cross_attention")}, "cross_attention"),  # Mllama's vision keys
    ({"supports_prefix_caching": False}, "supports_prefix_caching"),
    ({"supports_kv_transfer": False}, "supports_kv_transfer"),
    ({"kv_cache_kinds": ("full_attention", "sliding_window")}, None),  # one group with the hybrid manager off
    ({"kv_cache_kinds": ("mla",)}, None),
])
def test_shared_storage_connector_needs_kv_it_can_carry(llama, caps, refused):
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_models_registry.capabilities import ModelCapabilities
    from vllm_tt_platform.config.startup_checks import check_kv_transfer

    kv_config = {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"}
    config = EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST,
                        kv_transfer_config=kv_config).create_engine_config()
    capabilities = ModelCapabilities(**{"supports_kv_transfer": True, "supports_prefix_caching": True, **caps})
    if refused is None:
        check_kv_transfer(config, capabilities, "TinyForCausalLM", 1)
        return
    with pytest.raises(TTUnsupportedFeatureError) as info:
        check_kv_transfer(config, capabilities, "TinyForCausalLM", 1)
    assert refused in str(info.value) and "TinyForCausalLM" in str(info.value)


def test_config_alone_chooses_the_host_backend_for_vllms_registry_too(llama, monkeypatch):
    """With TT_MESH_BACKEND unset the registry plugin registered tt-metal's target; the config's
    choice (host) is what vLLM's model registry serves once the config is built."""
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_models_registry.registry import load_registry

    monkeypatch.delenv("TT_MESH_BACKEND", raising=False)
    builtin = load_registry("ttnn").resolve("TTLlamaForCausalLM").target
    vllm.ModelRegistry.register_model("TTLlamaForCausalLM", builtin)
    EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST).create_engine_config()
    entry = vllm.ModelRegistry.models["TTLlamaForCausalLM"]
    host = load_registry("host").resolve("TTLlamaForCausalLM").target
    assert f"{entry.module_name}:{entry.class_name}" == host != builtin


def test_sleep_beyond_pausing_is_refused_with_the_fix():
    """``POST /sleep?level=1`` (dev mode) reaches the worker: a typed error, not a missing method."""
    from vllm_tt_platform.worker import TTWorker

    worker = object.__new__(TTWorker)
    with pytest.raises(TTUnsupportedFeatureError, match="level=0") as info:
        worker.sleep(level=1)
    assert "Fix:" in str(info.value)
    with pytest.raises(TTUnsupportedFeatureError, match="scheduling"):
        worker.wake_up(tags=["weights"])


def test_ray_executor_is_refused_where_ray_is_installed(llama):
    """vLLM itself refuses ``--distributed-executor-backend ray`` without Ray installed (as here);
    with Ray installed the platform's check names the flag and the multi-host alternative."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_platform.config.startup_checks import check_vllm_features

    config = EngineArgs(model=str(llama), max_model_len=256, additional_config=_host()).create_engine_config()
    object.__setattr__(config.parallel_config, "distributed_executor_backend", "ray")
    with pytest.raises(TTUnsupportedFeatureError, match="--distributed-executor-backend.*docs/multi-host.md"):
        check_vllm_features(config)


@pytest.mark.parametrize(("spec", "error", "setting"), [
    # vLLM's own check (SpeculativeConfig), before the TT platform's
    ({"method": "draft_model", "num_speculative_tokens": 3, "vocab_size": 512}, ValueError,
     "same vocabulary size"),
    ({"method": "draft_model", "num_speculative_tokens": 8}, TTConfigError,
     "--speculative-config num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}, TTConfigError,
     "--speculative-config num_speculative_tokens"),
], ids=["drafter-vocabulary", "drafter-k-beyond-verify-trace", "ngram-k-beyond-verify-trace"])
def test_bad_speculation_is_refused_at_startup(llama, spec, error, setting):
    """A drafter must share the target's vocabulary, and K must fit the verify traces the model
    captures (the host models' ``max_verify_tokens`` is 8: K up to 7)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_testing.checkpoints import cached_drafter

    spec = dict(spec)
    if spec["method"] == "draft_model":
        spec["model"] = str(cached_drafter("llama", vocab_size=spec.pop("vocab_size", None)))
    with pytest.raises(error) as info:
        EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST,
                   speculative_config=spec).create_engine_config()
    assert setting in str(info.value)
    assert error is ValueError or "Fix:" in str(info.value)


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_5"])
def test_mtp_k_beyond_the_verify_trace_is_refused_at_startup(family):
    """``method: mtp`` with K beyond the verify traces is refused before the model loads (a
    checkpoint without MTP weights is refused when it loads: tt-host's test_host_mtp and
    test_host_qwen3_5)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_testing.checkpoints import cached_mtp
    from vllm_tt_testing.tiny_mtp import cached_qwen3_5_mtp

    model = cached_mtp() if family == "deepseek_v3" else cached_qwen3_5_mtp()
    with pytest.raises(TTConfigError) as info:
        EngineArgs(model=str(model), max_model_len=256, additional_config=HOST,
                   speculative_config={"method": "mtp", "num_speculative_tokens": 8}).create_engine_config()
    assert "--speculative-config num_speculative_tokens" in str(info.value) and "Fix:" in str(info.value)


def test_mtp_on_a_qwen3_5_checkpoint_without_an_mtp_module_is_refused_at_startup():
    """The tiny Qwen 3.5 declares no ``mtp_num_hidden_layers`` (nor ships ``mtp.*``): refused
    by the setting before the model loads."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_testing.checkpoints import cached_tiny

    with pytest.raises(TTConfigError) as info:
        EngineArgs(model=str(cached_tiny("qwen3_5", 100)), max_model_len=256, additional_config=HOST,
                   speculative_config={"method": "mtp", "num_speculative_tokens": 1}).create_engine_config()
    assert "--speculative-config method" in str(info.value) and "mtp_num_hidden_layers" in str(info.value)


def test_custom_class_is_the_models_own_drafter(llama):
    """``method: custom_class`` on TT names the platform's ``ModelDrafts`` (the model's own
    drafter) on a model declaring ``max_model_drafts``; any other proposer class, a model
    without a drafter of its own, or K beyond what it drafts is refused before the model loads."""
    from dataclasses import replace

    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_host.models.families import HostLlamaForCausalLM
    from vllm_tt_models_registry.contract import check_model_class
    from vllm_tt_platform.config.startup_checks import MODEL_DRAFTS, check_speculation
    from vllm_tt_platform.runner.model_drafts import ModelDrafts
    from vllm_tt_testing.checkpoints import cached_mtp

    assert f"{ModelDrafts.__module__}.{ModelDrafts.__qualname__}" == MODEL_DRAFTS

    def config(model, proposer, k=3):
        return EngineArgs(model=str(model), max_model_len=256, additional_config=HOST,
                          speculative_config={"method": "custom_class", "model": proposer,
                                              "num_speculative_tokens": k}).create_engine_config()

    served = config(llama, MODEL_DRAFTS)  # vLLM also infers custom_class from the dotted path alone
    assert served.speculative_config.method == "custom_class"
    with pytest.raises(TTUnsupportedFeatureError, match="--speculative-config model") as info:
        config(llama, "my_pkg.MyProposer")
    assert MODEL_DRAFTS in str(info.value) and "Fix:" in str(info.value)
    with pytest.raises(TTUnsupportedFeatureError, match="do not declare max_model_drafts"):
        config(cached_mtp(), MODEL_DRAFTS, k=1)
    caps = replace(check_model_class(HostLlamaForCausalLM, owner="test"), max_model_drafts=2)
    with pytest.raises(TTConfigError, match="at most 2 for TTLlamaForCausalLM") as info:
        check_speculation(served, caps, "TTLlamaForCausalLM")
    assert "set num_speculative_tokens to 2 or less" in str(info.value)


def test_explicit_async_scheduling_is_refused_with_a_drafter(llama, monkeypatch):
    """vLLM keeps async scheduling on for draft_model; the TT runner proposes drafts between
    steps, so an explicit --async-scheduling is refused (vLLM's default is switched off)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_tt_platform.config import cli_flags
    from vllm_tt_testing.checkpoints import cached_drafter

    spec = {"method": "draft_model", "model": str(cached_drafter("llama")), "num_speculative_tokens": 3}
    config = EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST,
                        speculative_config=spec).create_engine_config()
    assert config.scheduler_config.async_scheduling is False
    monkeypatch.setattr(cli_flags, "_given", {"async_scheduling"})
    with pytest.raises(TTUnsupportedFeatureError) as info:
        EngineArgs(model=str(llama), max_model_len=256, additional_config=HOST, async_scheduling=True,
                   speculative_config=spec).create_engine_config()
    assert "--async-scheduling" in str(info.value) and "Fix:" in str(info.value)


def test_mixed_steps_need_a_model_declaring_mixed_shapes():
    from types import SimpleNamespace

    from vllm_tt_models_registry.contract import ModelCapabilities
    from vllm_tt_platform.config.options import TTConfig
    from vllm_tt_platform.config.startup_checks import check_mixed_steps

    config = TTConfig.from_sources({"mixed_steps": True}, environ={})
    with pytest.raises(TTUnsupportedFeatureError) as info:
        check_mixed_steps(SimpleNamespace(speculative_config=None), config, ModelCapabilities(), "TTPlainForCausalLM")
    assert "TTPlainForCausalLM, whose model_capabilities declare no mixed_shapes" in str(info.value)
    check_mixed_steps(SimpleNamespace(speculative_config=None), config,
                      ModelCapabilities(mixed_shapes=((4, 32),)), "TTMixedForCausalLM")
