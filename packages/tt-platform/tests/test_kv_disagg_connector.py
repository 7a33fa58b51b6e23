"""The TT worker side of vLLM's shared-storage ``ExampleConnector``: vLLM's metadata (a
request's token ids and slots) turned into whole-block copies through the model contract and
one file per layer in the prompt's folder; a second connector over another KV cache loads
them into its own blocks. Only producers store; a missing folder is a load error for vLLM."""

from __future__ import annotations

import os

import pytest
import torch
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm_tt_platform.runner.kv_disagg.connector import ExampleConnector
from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout, LayerKV
from vllm_tt_platform.runner.kv_offload.device_pages import DevicePages
from vllm_tt_testing.block_copies import BlockCopyModel

BLOCK = 16
BLOCKS = 10
SHAPE = (BLOCKS, 2, BLOCK, 4)
NAMES = ["model.layers.0.self_attn", "model.layers.1.self_attn"]
PROMPT = list(range(100, 150))
"""50 tokens: vLLM's connector moves its first 3 blocks (48 tokens, all before the last token)."""


def _cache(seed: int) -> list[list[list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    return [[[torch.randn(SHAPE, generator=generator) for _ in range(2)] for _ in NAMES]]


def _connector(role: str, storage, kv) -> ExampleConnector:
    config = VllmConfig(kv_transfer_config=KVTransferConfig(
        kv_connector="ExampleConnector", kv_role=role, kv_connector_extra_config={"shared_storage_path": str(storage)}))
    config.cache_config.block_size = BLOCK
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=4, dtype=torch.float32)
    connector = ExampleConnector(config, KVConnectorRole.WORKER, KVCacheConfig(BLOCKS, [], [KVCacheGroupSpec(NAMES, spec)]))
    layout = KVLayout((KVGroup(0, (0, 1), BLOCK, None),), tuple(LayerKV(0, SHAPE, torch.float32, i) for i in (0, 1)))
    connector.attach(DevicePages(BlockCopyModel(), kv, layout))
    return connector


def _step(connector: ExampleConnector, block_ids: list[int], store: bool, prompt: list[int] = PROMPT) -> None:
    """One engine step as vLLM's mixin drives it: bind, load, (forward), save, clear."""
    metadata = ExampleConnectorMetadata()
    metadata.add_request(token_ids=prompt, block_ids=block_ids, block_size=BLOCK, is_store=store, mm_hashes=[])
    connector.bind_connector_metadata(metadata)
    connector.start_load_kv(None)  # type: ignore[arg-type]  # the TT worker side reads no forward context
    connector.wait_for_save()
    connector.clear_connector_metadata()


def test_a_stored_prompt_loads_into_another_engines_blocks(tmp_path):
    source, target = _cache(1), _cache(2)
    producer = _connector("kv_producer", tmp_path, source)
    _step(producer, [5, 6, 7, 8], store=True)
    [folder] = os.listdir(tmp_path)  # whole, renamed into place: no partial folder left
    assert sorted(os.listdir(tmp_path / folder)) == [f"{name}.safetensors" for name in NAMES]
    assert producer.blocks_stored == 3
    consumer = _connector("kv_consumer", tmp_path, target)
    _step(consumer, [1, 2, 3, 9], store=False)
    assert consumer.blocks_loaded == 3 and consumer.get_block_ids_with_load_errors() == set()
    for layer in (0, 1):
        for got, want in zip(target[0][layer], source[0][layer], strict=True):
            assert torch.equal(got[[1, 2, 3]], want[[5, 6, 7]]), f"layer {layer}"
            assert not torch.equal(got[9], want[8])  # the block past the last whole one is the engine's to compute


def test_only_producers_store(tmp_path):
    consumer = _connector("kv_consumer", tmp_path, _cache(3))
    _step(consumer, [1, 2, 3], store=True)
    assert os.listdir(tmp_path) == [] and consumer.blocks_stored == 0
    both = _connector("kv_both", tmp_path, _cache(3))
    _step(both, [1, 2, 3], store=True)
    assert len(os.listdir(tmp_path)) == 1 and both.blocks_stored == 3


@pytest.mark.parametrize("foreign", [False, True])
def test_a_missing_or_foreign_folder_is_a_load_error(tmp_path, foreign):
    """No folder, or one of another block count (an engine with another block size): vLLM gets
    the blocks as load errors, once (its kv_load_failure_policy fails the request)."""
    consumer = _connector("kv_consumer", tmp_path, _cache(5))
    if foreign:  # 2 blocks stored under the key of a prompt that needs 3
        _step(_connector("kv_producer", tmp_path, _cache(4)), [4, 5], store=True, prompt=PROMPT[:33])
        [stored] = os.listdir(tmp_path)
        metadata = ExampleConnectorMetadata()
        metadata.add_request(token_ids=PROMPT, block_ids=[1, 2, 3], block_size=BLOCK, is_store=False, mm_hashes=[])
        os.rename(tmp_path / stored, consumer._folder(metadata.requests[0]))
    _step(consumer, [1, 2, 3], store=False)
    assert consumer.get_block_ids_with_load_errors() == {1, 2, 3}
    assert consumer.get_block_ids_with_load_errors() == set() and consumer.blocks_loaded == 0
