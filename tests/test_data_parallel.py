"""vLLM's data parallelism on TT: lanes per host for single-program models, a sub-mesh per rank
for dense ones; the same rule on the head and on headless hosts (built vLLM configs only)."""

from __future__ import annotations

import json
import textwrap

import pytest
from vllm_tt_platform.config.data_parallel import LOCAL_RANKS_KEY, peer_watch
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.peer_watch import PeerWatch


@pytest.fixture(scope="module")
def llama(tiny_checkpoint):
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def dense_bundles(tmp_path_factory):
    """A Llama served by a model without single_program_lanes (a dense TT model); one folder
    for the module (a bundle's module name may be imported once per process)."""
    root = tmp_path_factory.mktemp("bundles")
    bundle = root / "dense_llama"
    bundle.mkdir(parents=True)
    (bundle / "vllm_metadata.json").write_text(
        json.dumps({"arch": "LlamaForCausalLM", "main_class": "dense_llama:DenseLlama"})
    )
    (bundle / "dense_llama.py").write_text(textwrap.dedent("""
        from vllm_tt_host.models.families import HostLlamaForCausalLM

        class DenseLlama(HostLlamaForCausalLM):
            model_capabilities = {**HostLlamaForCausalLM.model_capabilities, "single_program_lanes": False}
    """))
    return root


@pytest.fixture
def dense_bundle(dense_bundles, monkeypatch) -> None:
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(dense_bundles))


def build(llama, monkeypatch, mesh: str, headless: bool = False, **dp):
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("MESH_DEVICE", mesh)
    args = EngineArgs(model=str(llama), max_model_len=256, max_num_seqs=8,
                      additional_config={"tt": {"mesh_backend": "host"}}, **dp)
    return args.create_engine_config(headless=headless)


def test_lanes_fold_the_local_ranks_of_each_host(llama, monkeypatch):
    config = build(llama, monkeypatch, "TG", data_parallel_size=8, data_parallel_size_local=4)
    tt, parallel = config.additional_config["tt"], config.parallel_config
    assert (tt["_lanes"], tt["_rows_per_lane"]) == (4, 8)
    assert (parallel.data_parallel_size, parallel.data_parallel_size_local, parallel.data_parallel_rank) == (2, 1, 0)
    assert config.scheduler_config.max_num_seqs == 32
    assert config.scheduler_config.scheduler_cls == "vllm_tt_scheduler.TTLaneCoordinator"


def test_a_headless_host_becomes_the_next_dp_rank(llama, monkeypatch):
    config = build(llama, monkeypatch, "TG", headless=True, data_parallel_size=8, data_parallel_size_local=4,
                   data_parallel_start_rank=4)
    parallel = config.parallel_config
    assert (parallel.data_parallel_size, parallel.data_parallel_size_local, parallel.data_parallel_rank) == (2, 1, 1)
    assert config.additional_config["tt"]["_lanes"] == 4


def test_one_host_keeps_every_rank_as_a_lane(llama, monkeypatch):
    config = build(llama, monkeypatch, "TG", data_parallel_size=4)
    assert config.additional_config["tt"]["_lanes"] == 4
    assert config.parallel_config.data_parallel_size == 1


@pytest.mark.parametrize(("dp", "setting"), [
    ({"data_parallel_size": 8, "data_parallel_size_local": 3}, "--data-parallel-size-local"),
    ({"data_parallel_size": 8, "data_parallel_size_local": 4, "data_parallel_start_rank": 2}, "--data-parallel-start-rank"),
    ({"data_parallel_size": 6, "data_parallel_size_local": 3}, "data_parallel_size"),  # 3 lanes do not split (8,4)
])
def test_lanes_that_do_not_fit_the_hosts_are_refused(llama, monkeypatch, dp, setting):
    with pytest.raises(TTConfigError, match=setting) as info:
        build(llama, monkeypatch, "TG", headless=True, **dp)
    assert "Fix:" in str(info.value)


def test_dense_ranks_split_the_host_mesh(llama, monkeypatch, dense_bundle):
    from vllm_tt_platform.config.setup import resolve_setup

    config = build(llama, monkeypatch, "T3K", data_parallel_size=2)
    tt = config.additional_config["tt"]
    assert tt[LOCAL_RANKS_KEY] == 2 and "_lanes" not in tt
    assert config.parallel_config.data_parallel_size == 2
    # What the engine core of local rank 1 opens, once vLLM made it an independent rank.
    config.parallel_config.data_parallel_rank_local = 1
    config.parallel_config.data_parallel_index = 1
    config.parallel_config.reconfigure_for_independent_dp_rank()
    mesh = resolve_setup(config).topology.mesh
    assert (mesh.shape.rows, mesh.shape.cols, mesh.device_ids) == (1, 4, (4, 5, 6, 7))
    assert "DP rank 1 (local 1 of 2)" in mesh.source


def test_dense_ranks_must_divide_the_host_mesh(llama, monkeypatch, dense_bundle):
    with pytest.raises(TTConfigError, match="data_parallel_size"):
        build(llama, monkeypatch, "N300", data_parallel_size=3)


def _engine(config, rank: int, local: int):
    """The config as vLLM's engine core of DP rank ``rank`` (local index ``local``) sees it."""
    config.parallel_config.data_parallel_index, config.parallel_config.data_parallel_rank_local = rank, local
    config.parallel_config.reconfigure_for_independent_dp_rank()
    return config


def test_engines_of_several_hosts_join_the_host_watch(llama, monkeypatch, dense_bundle):
    dp = {"data_parallel_size": 4, "data_parallel_size_local": 2, "data_parallel_address": "127.0.0.1",
          "data_parallel_rpc_port": 13345}
    head = build(llama, monkeypatch, "N300", **dp)
    assert peer_watch(_engine(head, 0, 0)) == PeerWatch("127.0.0.1", 13346, 0, head=True)
    assert peer_watch(_engine(head, 1, 1)) is None  # vLLM watches the head's own engines
    other = build(llama, monkeypatch, "N300", headless=True, data_parallel_start_rank=2, **dp)
    assert peer_watch(_engine(other, 3, 1)) == PeerWatch("127.0.0.1", 13346, 3, head=False)
    lanes = build(llama, monkeypatch, "TG", headless=True, data_parallel_size=8, data_parallel_size_local=4,
                  data_parallel_start_rank=4)
    assert peer_watch(_engine(lanes, 1, 0)).head is False


def test_one_host_has_no_host_watch(llama, monkeypatch, dense_bundle):
    config = build(llama, monkeypatch, "N300", data_parallel_size=2)
    assert peer_watch(_engine(config, 0, 0)) is None


def test_mixture_of_experts_ranks_across_hosts_are_refused(tiny_checkpoint, monkeypatch):
    """vLLM would step an MoE model's DP engines in lockstep with dummy batches: one host's lanes
    are one engine (served), two hosts' engines are refused before any device work."""
    gpt_oss = tiny_checkpoint("gpt_oss")
    one_host = build(gpt_oss, monkeypatch, "TG", data_parallel_size=4)
    assert one_host.parallel_config.data_parallel_size == 1
    with pytest.raises(TTUnsupportedFeatureError, match="mixture-of-experts.*DPEngineCoreProc"):
        build(gpt_oss, monkeypatch, "TG", data_parallel_size=8, data_parallel_size_local=4)
