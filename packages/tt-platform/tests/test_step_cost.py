"""``tt.step_cost``: the platform hands the phase scheduler the host backend's device-time model
of the served model and mesh (or a named one), as the scheduler's roofline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.step_cost import hand_step_cost, roofline, step_cost_model
from vllm_tt_platform.cost.device_time import MODEL_PROFILES, parse_device_time
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.shape import MESH_PRESETS, MeshRequest
from vllm_tt_platform.mesh.topology import Topology
from vllm_tt_scheduler import SchedulerOptions

LLAMA_8B = SimpleNamespace(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, vocab_size=128256)
N150 = MeshRequest(MESH_PRESETS["N150"], "MESH_DEVICE=N150", "N150")


@pytest.mark.parametrize("spec", ["llama-3.1-8b@N150", "llama-3.3-70b@TG"])
def test_roofline_reproduces_the_device_time_model(spec: str) -> None:
    parsed = parse_device_time(spec)
    assert parsed.mesh_preset is not None
    costs = parsed.resolve(MODEL_PROFILES[str(parsed.model)], MESH_PRESETS[parsed.mesh_preset], parsed.mesh_preset)
    cost = roofline(costs, spec)
    for context in (0, 20_000):
        assert cost.decode_s(32, context) == pytest.approx(costs.decode_s(context), rel=1e-6)
    stream = costs.decode_s(0)
    for tokens in (16, 512, 1024):
        assert cost.prefill_s(tokens, 1) == pytest.approx(max(stream, costs.prefill_s(tokens, 0)), rel=1e-6)
        assert cost.prefill_s(2 * tokens, 2) == pytest.approx(max(stream, 2 * costs.prefill_s(tokens, 0)), rel=1e-6)
    # The SLO-aware mixed chunk policy prices a mixed step as the host model's program does.
    for context, chunk, start in ((0, 16, 0), (20_000, 512, 0), (20_000, 1024, 700)):
        assert cost.mixed_s(32, context, chunk, start) == pytest.approx(
            costs.mixed_s(context, 32, [(chunk, start)]), rel=1e-6)


def test_fixed_duration_costs_every_program_the_same() -> None:
    cost = step_cost_model("40ms", LLAMA_8B, N150)
    assert cost.decode_s(32, 50_000) == pytest.approx(0.04)
    assert cost.prefill_s(1000, 1) == pytest.approx(0.04) and cost.prefill_s(300, 3) == pytest.approx(0.12)


def test_served_checkpoint_on_the_opened_mesh_reaches_the_scheduler() -> None:
    tt: dict[str, object] = {}
    cost = hand_step_cost(tt, "served", LLAMA_8B, Topology(N150, 1, 32))
    assert cost == roofline(parse_device_time("llama-3.1-8b@N150").resolve(
        MODEL_PROFILES["llama-3.1-8b"], MESH_PRESETS["N150"], "N150"), cost.description)
    assert cost.description.startswith("served: cost model served on N150")
    assert SchedulerOptions.from_additional_config({"tt": tt}).step_cost == cost


def test_option_is_typed_and_checked() -> None:
    assert TTConfig.from_sources({}).step_cost is None
    assert TTConfig.from_sources({"step_cost": "llama-3.3-70b@TG"}).step_cost == "llama-3.3-70b@TG"
    with pytest.raises(TTConfigError, match=r"tt\.step_cost='gpt-9'"):
        TTConfig.from_sources({"step_cost": "gpt-9"})


def test_refused_where_the_scheduler_cannot_use_it() -> None:
    with pytest.raises(TTConfigError, match="in-process lanes"):
        hand_step_cost({}, "served", LLAMA_8B, Topology(N150, 4, 8))
    with pytest.raises(TTConfigError, match="name a model profile"):
        hand_step_cost({}, "served", SimpleNamespace(hidden_size=64), Topology(N150, 1, 32))
