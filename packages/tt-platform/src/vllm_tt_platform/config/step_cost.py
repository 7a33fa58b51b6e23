"""The step cost model the platform hands the phase scheduler (``tt.step_cost``).

The scheduler decides by modelled device time only when it gets one (``vllm_tt_scheduler.cost``);
its numbers come from the device cost model (``cost.device_time``), the same roofline the host
backend replays, of the served checkpoint (or a named model profile) on the served mesh (or a
named preset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_tt_scheduler.cost import RooflineStepCost, record_step_cost

from vllm_tt_platform.cost.device_time import ModelDims, ProgramCosts, parse_device_time
from vllm_tt_platform.errors import TTConfigError

if TYPE_CHECKING:
    from vllm_tt_platform.mesh.shape import MeshRequest
    from vllm_tt_platform.mesh.topology import Topology

SETTING = "--additional-config.tt.step_cost"


STEP_COST_FORMS = (
    "`served` (the served checkpoint on the MESH_DEVICE mesh), a model profile (`llama-3.1-8b`, "
    "`llama-3.3-70b`, on the MESH_DEVICE mesh), `<model>@<MESH_DEVICE preset>` such as "
    "`llama-3.3-70b@TG`, or a fixed duration such as `40ms` (every step takes that long)"
)


def roofline(costs: ProgramCosts, description: str) -> RooflineStepCost:
    """The scheduler's roofline, read off the device-time model's own costs: a program's fixed
    cost, the weight stream, KV per position, matmul per token and attention per token pair."""
    program = costs.prefill_s(0, 0)
    kv_probe = 1_000_000
    attention = costs.prefill_s(1, 1) - costs.prefill_s(1, 0)
    return RooflineStepCost(
        program_s=program,
        weights_s=max(0.0, costs.decode_s(0) - program),
        kv_s_per_token=max(0.0, (costs.decode_s(kv_probe) - costs.decode_s(0)) / kv_probe),
        prefill_s_per_token=max(0.0, costs.prefill_s(1, 0) - program - attention / 2),
        attention_s_per_token_pair=max(0.0, attention),
        description=description,
    )


def step_cost_model(spec: str, hf_config: Any, mesh: MeshRequest) -> RooflineStepCost:
    """The cost model ``spec`` names, for a checkpoint of ``hf_config`` on ``mesh``."""
    parsed = parse_device_time(spec)
    costs = parsed.resolve(ModelDims.from_hf(hf_config), mesh.shape, mesh.preset)
    return roofline(costs, f"{spec}: {costs.description}")


def hand_step_cost(tt: dict[str, Any], spec: str, hf_config: Any, topology: Topology) -> RooflineStepCost:
    """Give the phase scheduler the cost model ``spec`` names (it then runs its cost-aware
    policy); ``TTConfigError`` when this engine cannot use one."""
    if topology.lanes > 1:
        raise TTConfigError(SETTING, spec, "unset when the mesh runs in-process lanes",
                            "remove it: the lane coordinator keeps the step-counted policy")
    try:
        cost = step_cost_model(spec, hf_config, topology.mesh)
    except (AttributeError, TypeError, ValueError) as error:
        raise TTConfigError(SETTING, spec, STEP_COST_FORMS,
                            f"name a model profile instead of the served checkpoint ({error})") from error
    record_step_cost(tt, cost)
    return cost
