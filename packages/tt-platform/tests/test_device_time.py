"""The device cost model (``cost.device_time``): the ``host_device_time`` / ``step_cost`` value
forms and the roofline's orders of magnitude."""

from __future__ import annotations

import pytest
from vllm_tt_platform.cost.device_time import (
    CHIPS,
    MODEL_PROFILES,
    SERVED,
    DeviceTimeSpec,
    MeshCost,
    ModelDims,
    parse_device_time,
)
from vllm_tt_platform.mesh.shape import MESH_PRESETS, MeshShape

TINY = ModelDims(2, 128, 256, 4, 2, 32, 1024, tied_embeddings=True)


@pytest.mark.parametrize(("text", "spec"), [
    ("25ms", DeviceTimeSpec(fixed_s=0.025)),
    ("800us", DeviceTimeSpec(fixed_s=800e-6)),
    ("0.04s", DeviceTimeSpec(fixed_s=0.04)),
    (" 0ms ", DeviceTimeSpec(fixed_s=0.0)),
    ("served", DeviceTimeSpec(model=SERVED)),
    ("llama-3.1-8b", DeviceTimeSpec(model="llama-3.1-8b")),
    ("Llama-3.3-70B@tg", DeviceTimeSpec(model="llama-3.3-70b", mesh_preset="TG")),
    ("served@n300", DeviceTimeSpec(model=SERVED, mesh_preset="N300")),
])
def test_device_time_forms(text, spec):
    assert parse_device_time(text) == spec


@pytest.mark.parametrize(("text", "named"), [
    ("fast", "unknown model 'fast'"),
    ("llama@N150", "unknown model 'llama'"),
    ("llama-3.1-8b@N999", "unknown mesh preset 'N999'"),
    ("25 minutes", "unknown model"),
])
def test_bad_device_time_names_the_accepted_forms(text, named):
    with pytest.raises(ValueError, match=named) as info:
        parse_device_time(text)
    assert "llama-3.1-8b@N150" in str(info.value) or "N150" in str(info.value)


def test_cost_model_orders_of_magnitude():
    """Decode streams the weights once per step: ~40 ms for 8B on one Wormhole, ~14 ms for 70B
    on a 32-chip Galaxy (collectives included)."""
    n150 = parse_device_time("llama-3.1-8b@N150").resolve(TINY, MeshShape(1, 1), None)
    tg = parse_device_time("llama-3.3-70b@TG").resolve(TINY, MeshShape(1, 1), None)
    assert 0.030 < n150.decode_s(0) < 0.050
    assert 0.010 < tg.decode_s(0) < 0.020
    dims = MODEL_PROFILES["llama-3.1-8b"]
    assert 7.9e9 < dims.streamed_params + dims.vocab_size * dims.hidden_size < 8.1e9  # 8.03B parameters
    mesh = n150.mesh
    expected = dims.streamed_params * 1.0625 / (CHIPS["wormhole"].dram_bytes_per_s * mesh.dram_efficiency)
    assert n150.decode_s(0) == pytest.approx(expected + mesh.program_overhead_s)
    # KV read grows a step; collectives only on multi-chip meshes.
    assert n150.decode_s(32 * 1024) - n150.decode_s(0) == pytest.approx(32 * 1024 * dims.kv_bytes_per_token / (
        CHIPS["wormhole"].dram_bytes_per_s * mesh.dram_efficiency))
    assert n150._collectives_s(dims, mesh) == 0 and tg._collectives_s(MODEL_PROFILES["llama-3.3-70b"], tg.mesh) > 0
    assert n150.prefill_s(256, 0) > 2 * n150.prefill_s(128, 0) - mesh.program_overhead_s
    assert n150.readback_s(4096) > n150.readback_s(0) > 0


def test_mesh_cost_follows_the_mesh():
    assert MeshCost.of_mesh(MESH_PRESETS["P150x4"], "P150x4").chip is CHIPS["blackhole"]
    assert MeshCost.of_mesh(MeshShape(1, 8), None) == MeshCost(chip=CHIPS["wormhole"], devices=8)
    served = DeviceTimeSpec(model=SERVED).resolve(TINY, MeshShape(1, 2), "N300")
    assert served.dims == TINY and served.mesh.devices == 2 and "N300" in served.description


def test_fixed_duration_applies_to_every_program():
    costs = parse_device_time("3ms").resolve(TINY, MeshShape(1, 1), None)
    assert costs.decode_s(10_000) == costs.prefill_s(4096, 100) == 0.003
    assert costs.readback_s(1 << 20) == 0.0


def test_model_dims_from_a_transformers_config():
    from transformers import LlamaConfig

    hf = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=500)
    dims = ModelDims.from_hf(hf)
    assert (dims.num_layers, dims.head_dim, dims.num_kv_heads, dims.vocab_size) == (3, 16, 2, 500)
    assert dims.layer_params == 64 * 16 * (8 + 4) + 3 * 64 * 96
