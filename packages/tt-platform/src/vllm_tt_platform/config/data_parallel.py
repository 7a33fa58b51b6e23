"""vLLM's data parallelism on TT: which ranks share a host's mesh, and how.

One rule, applied the same way in every process that builds a vLLM config (the head's front
end, a ``--headless`` host, each engine core), so all of them agree:

* a **single-program** model (``single_program_lanes``) runs the ranks local to one host as
  in-process lanes of one engine: ``--data-parallel-size N --data-parallel-size-local L``
  becomes ``N / L`` vLLM DP ranks (one per host) of ``L`` lanes each;
* a **dense** model keeps vLLM's ranks, each an independent engine; the ``L`` ranks of a host
  split its mesh (``MESH_DEVICE``) into ``L`` sub-meshes, rank ``i`` opening the ``i``-th.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from vllm.logger import init_logger
from vllm_tt_scheduler.lanes.shape import LaneShape

from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.peer_watch import PeerWatch
from vllm_tt_platform.mesh.shape import MeshRequest, mesh_request

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("vllm." + __name__)

LOCAL_RANKS_KEY = "_dp_local_ranks"
"""``tt`` key: how many dense DP ranks share this host's mesh (written by ``fold``; the engine
core no longer knows, vLLM resets its DP sizes to 1 for an independent rank)."""
MULTI_HOST_KEY = "_dp_multi_host"
"""``tt`` key: the DP ranks span more than this host (written by ``fold``, read by ``peer_watch``)."""


@dataclass(frozen=True)
class HostRank:
    """This engine's place among the dense data-parallel ranks of its host."""

    local: int
    """Index among the host's ranks: which sub-mesh this engine opens."""
    count: int
    """Ranks on this host: the host mesh splits into this many sub-meshes."""
    rank: int
    """Global DP rank (for the log)."""

    def mesh(self, host: MeshRequest, environ: Mapping[str, str] | None = None) -> MeshRequest:
        """This rank's sub-mesh of the host's mesh, with the devices it owns."""
        return host.sub_mesh(self.local, self.count, f"DP rank {self.rank} (local {self.local} of {self.count})",
                             environ)


def fold(vllm_config: VllmConfig, single_program_lanes: bool, arch: str) -> None:
    """Apply the rule above to ``vllm_config`` (idempotent: a second call changes nothing)."""
    tt = cast(dict[str, Any], vllm_config.additional_config)["tt"]  # configure() made it a dict
    parallel = vllm_config.parallel_config
    if LaneShape.recorded(tt) or LOCAL_RANKS_KEY in tt or parallel.data_parallel_size <= 1:
        return
    multi_host = parallel.data_parallel_size > parallel.data_parallel_size_local
    requested = parallel.data_parallel_size
    if single_program_lanes:
        _fold_into_lanes(vllm_config, tt, arch)
    else:
        _record_dense_ranks(vllm_config, tt)
    if parallel.data_parallel_size > 1 and vllm_config.model_config.is_moe:
        raise TTUnsupportedFeatureError(
            "--data-parallel-size", requested,
            f"the ranks of one host only for the mixture-of-experts model {arch} (one engine, in lanes)",
            "vLLM steps MoE data-parallel engines in lockstep waves with dummy batches (DPEngineCoreProc), "
            "which a TT engine does not run; serve it on one host (--data-parallel-size-local equal to "
            "--data-parallel-size, a single_program_lanes model) or one server per host behind a router",
        )
    if multi_host:
        tt[MULTI_HOST_KEY] = True


def peer_watch(vllm_config: VllmConfig) -> PeerWatch | None:
    """This engine's side of the host liveness watch (``mesh.peer_watch``), or None: one host,
    or an engine of the head other than rank 0 (vLLM watches the head's own engines)."""
    extra = vllm_config.additional_config
    tt = (extra.get("tt") if isinstance(extra, dict) else None) or {}
    if tt.get(MULTI_HOST_KEY) is not True:
        return None
    parallel = vllm_config.parallel_config
    rank = parallel.data_parallel_index
    host_start = rank - (parallel.data_parallel_rank_local or 0)
    if rank != 0 and host_start == 0:
        return None
    return PeerWatch(parallel.data_parallel_master_ip, parallel.data_parallel_rpc_port + 1, rank, head=rank == 0)


def host_rank(vllm_config: VllmConfig) -> HostRank | None:
    """The dense DP rank this process serves, or None when the host mesh is not split."""
    extra = vllm_config.additional_config
    tt = (extra.get("tt") if isinstance(extra, dict) else None) or {}
    count = tt.get(LOCAL_RANKS_KEY)
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TTConfigError(f"--additional-config.tt.{LOCAL_RANKS_KEY}", count, "a positive int, written by the "
                            "platform", f"remove {LOCAL_RANKS_KEY} from --additional-config (it is internal)")
    parallel = vllm_config.parallel_config
    local = parallel.data_parallel_rank_local or 0
    return HostRank(local, count, parallel.data_parallel_index)


def _local_ranks(parallel: Any) -> int:
    local = parallel.data_parallel_size_local
    if local < 1:
        raise TTConfigError(
            "--data-parallel-size-local", local, "at least 1 on a TT host (each host runs its engines)",
            "run the API-only head with the engines of one host, e.g. --data-parallel-size-local 1",
        )
    return int(local)


def _fold_into_lanes(vllm_config: VllmConfig, tt: MutableMapping[str, Any], arch: str) -> None:
    parallel = vllm_config.parallel_config
    ranks, lanes = parallel.data_parallel_size, _local_ranks(parallel)
    if ranks % lanes:
        raise TTConfigError(
            "--data-parallel-size-local", lanes, f"a divisor of --data-parallel-size {ranks} (every host "
            "runs the same number of lanes)", "give every host the same --data-parallel-size-local",
        )
    start = parallel.data_parallel_rank
    if start % lanes:
        raise TTConfigError(
            "--data-parallel-start-rank", start, f"a multiple of --data-parallel-size-local {lanes}",
            f"start host h at rank h * {lanes}",
        )
    mesh = mesh_request()
    sub = mesh.shape.split(lanes)  # raises when the lanes do not divide the host's mesh
    scheduler = vllm_config.scheduler_config
    shape = LaneShape(lanes, scheduler.max_num_seqs)
    shape.record(tt)
    scheduler.max_num_seqs *= lanes
    scheduler.max_num_batched_tokens = max(scheduler.max_num_batched_tokens, scheduler.max_num_seqs)
    hosts = ranks // lanes
    parallel.data_parallel_size = hosts
    parallel.data_parallel_size_local = 1
    parallel.data_parallel_rank = start // lanes
    logger.info(
        "Data parallelism as in-process lanes: %s declares single_program_lanes; %d host%s x %d lanes x "
        "%d rows, each host's mesh %s split into %s sub-meshes, one engine process per host%s.",
        arch, hosts, "s" if hosts > 1 else "", lanes, shape.rows_per_lane, mesh.shape, sub,
        f" (this host: DP rank {parallel.data_parallel_rank})" if hosts > 1 else "",
    )


def _record_dense_ranks(vllm_config: VllmConfig, tt: MutableMapping[str, Any]) -> None:
    parallel = vllm_config.parallel_config
    local = _local_ranks(parallel)
    host = mesh_request()
    host.shape.split(local)  # raises when the host's ranks do not divide its mesh
    tt[LOCAL_RANKS_KEY] = local
    logger.info(
        "Data parallelism: %d independent engine(s) on this host (of %d DP ranks), each on a %s "
        "sub-mesh of %s.", local, parallel.data_parallel_size, host.shape.split(local), host.shape,
    )
