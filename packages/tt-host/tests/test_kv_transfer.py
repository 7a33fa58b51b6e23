"""KV blocks between the emulated mesh and host memory (``read_kv_blocks`` / ``write_kv_blocks``)
for every KV kind the host models hold: full and sliding-window attention (``[K, V]``), latent
attention (one tensor), a recurrent layer's states; and what a copy costs on the device clock."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice
from vllm_tt_host.models.deepseek_v3.model import HostDeepseekV3ForCausalLM
from vllm_tt_host.models.families import HostLlamaForCausalLM
from vllm_tt_host.models.frame.kv_transfer import layer_tensors
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.gemma3.model import HostGemma3ForCausalLM
from vllm_tt_host.models.qwen3_5.config import Qwen3_5Config
from vllm_tt_host.models.qwen3_5.model import HostQwen3_5ForCausalLM
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.checkpoints import cached_tiny

BLOCKS = 12
BLOCK = 16


def _specs(model, kind: str) -> list:
    cfg = model.config
    if kind == "recurrent":
        assert isinstance(cfg, Qwen3_5Config)
        states = ((BLOCKS, *cfg.delta.conv_state_shape), (BLOCKS, *cfg.delta.recurrent_state_shape))
        attention = (BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim)
        return [(states, (torch.float32,) * 2, 0) if cfg.linear(i) else (attention, torch.float32, 0)
                for i in range(cfg.num_layers)]
    heads = 1 if kind == "mla" else cfg.num_kv_heads
    return [((BLOCKS, heads, BLOCK, cfg.head_dim), torch.float32, i) for i in range(cfg.num_layers)]


KINDS = {
    # kind: (model class, tiny checkpoint, train steps)
    "full": (HostLlamaForCausalLM, "llama", 0),
    "sliding": (HostGemma3ForCausalLM, "gemma3", 0),
    "mla": (HostDeepseekV3ForCausalLM, "deepseek_v3", 120),
    "recurrent": (HostQwen3_5ForCausalLM, "qwen3_5", 100),
}


def _build(kind: str, options: HostDeviceOptions | None = None):
    cls, arch, steps = KINDS[kind]
    model = cls.initialize_vllm_model(AutoConfig.from_pretrained(cached_tiny(arch, steps)),
                                      HostMeshDevice(MeshShape(1, 1), options=options), 2, 64)
    if kind == "full":
        return model, model.allocate_kv_cache((BLOCKS, model.config.num_kv_heads, BLOCK, model.config.head_dim),
                                              torch.float32, model.config.num_layers)
    return model, model.allocate_kv_cache_per_layer(_specs(model, kind))


def _fill(kv, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for layer in kv[0]:
        for tensor in layer_tensors(layer):
            tensor.copy_(torch.randn(tensor.shape, generator=generator))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_blocks_go_to_the_host_and_back_into_other_blocks(kind):
    """Blocks read from one cache and written into other ids of another cache hold the same
    values there, every tensor of every layer (K and V, the latent, both recurrent states),
    and nothing else changes."""
    model, source = _build(kind)
    _, target = _build(kind)
    _fill(source, 1)
    _fill(target, 2)
    before = [[t.clone() for t in layer_tensors(layer)] for layer in target[0]]
    layers = list(range(model.config.num_layers))
    pages = model.read_kv_blocks(kv_cache=source, lane=0, layers=layers, block_ids=[3, 5]).result()
    if kind == "mla":
        assert all(len(p) == 1 for p in pages)  # the latent is one tensor, read once
    if kind == "recurrent":  # a delta-net layer's pages are its two states
        cfg = model.config
        assert [tuple(t.shape[1:]) for t in pages[0]] == [cfg.delta.conv_state_shape, cfg.delta.recurrent_state_shape]
    model.write_kv_blocks(kv_cache=target, lane=0, layers=layers, block_ids=[7, 1], pages=pages).result()
    moved = torch.tensor([7, 1])
    kept = torch.tensor([b for b in range(BLOCKS) if b not in (7, 1)])
    for layer, old in zip(range(len(layers)), before, strict=True):
        for src, dst, was in zip(layer_tensors(source[0][layer]), layer_tensors(target[0][layer]), old, strict=True):
            assert torch.equal(dst[moved], src[torch.tensor([3, 5])]), f"layer {layer}"
            assert torch.equal(dst[kept], was[kept]), f"layer {layer}: a block outside the write changed"


def test_a_copy_is_checked_before_it_is_queued():
    model, kv = _build("full")
    with pytest.raises(HostModelInputError, match="outside the lane's 12 blocks"):
        model.read_kv_blocks(kv_cache=kv, lane=0, layers=[0], block_ids=[12])
    with pytest.raises(HostModelInputError, match="lane 1"):
        model.read_kv_blocks(kv_cache=kv, lane=1, layers=[0], block_ids=[1])
    pages = model.read_kv_blocks(kv_cache=kv, lane=0, layers=[0], block_ids=[1, 2]).result()
    with pytest.raises(HostModelInputError, match="takes pages of shapes"):
        model.write_kv_blocks(kv_cache=kv, lane=0, layers=[0], block_ids=[1], pages=pages)


def test_a_copy_runs_on_the_device_clock_in_queue_order():
    """Under modelled time a copy returns at once and completes after the host link's time
    for its tokens' KV (``kv_transfer_s``): behind a queued prefill, so it reads the KV the
    prefill wrote."""
    options = HostDeviceOptions(device_time=parse_device_time("llama-3.1-8b@N150"))
    model, kv = _build("full", options)
    costs = model.costs
    blocks = [1, 2, 3, 4]
    tokens = torch.arange(3, 3 + 4 * BLOCK)[None]
    table = torch.tensor([blocks])
    logits = model.prefill_forward(tokens=tokens, page_table=table, kv_cache=kv, prompt_lens=[4 * BLOCK])
    assert logits.shape[-1] == model.config.vocab_size
    start = model.queue.stats.modelled_s
    handle = model.read_kv_blocks(kv_cache=kv, lane=0, layers=[0, 1], block_ids=blocks)
    pages = handle.result()
    assert model.queue.stats.modelled_s - start == pytest.approx(costs.kv_transfer_s(4 * BLOCK))
    assert costs.kv_transfer_s(4 * BLOCK) > costs.kv_transfer_s(BLOCK) > 0
    assert all(bool(p[0].abs().sum() > 0) for p in pages)  # the prefill's K, not the zeros it started as
