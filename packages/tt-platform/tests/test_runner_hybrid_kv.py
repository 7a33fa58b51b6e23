"""Hybrid KV on the runner side: a model declaring sliding-window layers gets one page table per
layer, built from its KV cache group, pointing only at blocks vLLM still holds for that request.

The runner is driven by vLLM's own scheduler (the TT phase scheduler over vLLM's hybrid KV cache
manager) and a contract model that only records what it is sent; every call is checked against
the blocks vLLM's KV cache coordinator holds at that step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch
from vllm.config import ModelConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec, SlidingWindowSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm_tt_models_registry import RegisteredModel
from vllm_tt_platform import compat
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.setup import TTSetup
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import mesh_request
from vllm_tt_platform.mesh.topology import Topology
from vllm_tt_platform.runner.model_runner import TTModelRunner
from vllm_tt_platform.worker import TTWorker
from vllm_tt_scheduler import TTScheduler
from vllm_tt_testing.scheduler_sim import SimConfig, build_vllm_config

BLOCK = 16
WINDOW = 20
LAYERS = 4
VOCAB = 64
MAX_LEN = 256


def spec_of(kinds: str, head_dims: tuple[int, ...] = ()) -> dict[str, KVCacheSpec]:
    """``kinds``: one letter per layer, ``s`` sliding (``WINDOW``) or ``f`` full."""
    specs: dict[str, KVCacheSpec] = {}
    for i, kind in enumerate(kinds):
        common = {"block_size": BLOCK, "num_kv_heads": 2, "head_size": head_dims[i] if head_dims else 16,
                  "dtype": torch.float32}
        specs[f"model.layers.{i}.self_attn"] = (
            SlidingWindowSpec(**common, sliding_window=WINDOW) if kind == "s" else FullAttentionSpec(**common)
        )
    return specs


@dataclass
class Call:
    kind: str
    kwargs: dict[str, Any]
    vllm_blocks: dict[str, tuple[list[int], ...]] = field(default_factory=dict)
    """What vLLM's KV cache coordinator held for each scheduled request at that step."""
    slots: dict[str, int] = field(default_factory=dict)


class RecordingModel:
    """A contract model that computes nothing: it records every call and favours token 7."""

    model_capabilities: ClassVar[dict[str, Any]] = {}
    kinds: ClassVar[str] = "ffff"

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.calls: list[Call] = []
        self.allocations: list[tuple[Any, ...]] = []

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: Any, max_batch_size: int, max_seq_len: int,
                              tt_data_parallel: int = 1, optimizations: str | None = None) -> RecordingModel:
        return cls(max_batch_size)

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, ...], dtype: Any, num_layers: int) -> str:
        self.allocations.append(("allocate_kv_cache", tuple(kv_cache_shape), dtype, num_layers))
        return "kv"

    def _logits(self, rows: int) -> torch.Tensor:
        logits = torch.zeros((rows, 1, VOCAB))
        logits[:, :, 7] = 1.0
        return logits

    def prefill_forward(self, tokens: Any, page_table: Any, kv_cache: Any, prompt_lens: Any, start_pos: Any = None,
                        empty_slots: Any = None, enable_trace: bool = False, **kwargs: Any) -> torch.Tensor:
        self.calls.append(Call("prefill", {"tokens": tokens, "page_table": page_table, "kv_cache": kv_cache,
                                           "prompt_lens": prompt_lens, "start_pos": start_pos,
                                           "empty_slots": empty_slots, "enable_trace": enable_trace, **kwargs}))
        return self._logits(tokens.shape[0])

    def decode_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, enable_trace: bool = False,
                       read_from_device: bool = True, **kwargs: Any) -> torch.Tensor:
        self.calls.append(Call("decode", {"tokens": tokens, "start_pos": start_pos, "page_table": page_table,
                                          "kv_cache": kv_cache, "enable_trace": enable_trace,
                                          "read_from_device": read_from_device, **kwargs}))
        return self._logits(tokens.shape[0])


class HybridModel(RecordingModel):
    """Declares sliding-window layers (opting into ``page_tables_per_layer``)."""

    kinds = "sfsf"

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        return spec_of(cls.kinds)

    def allocate_kv_cache_per_layer(self, per_layer_specs: Any) -> str:
        self.allocations.append(("allocate_kv_cache_per_layer", list(per_layer_specs)))
        return "kv"


class GemmaLikeModel(HybridModel):
    kinds = "sssf"


class UniformHybridLegacyModel(RecordingModel):
    """Declares sliding layers of one shape but allocates through the legacy call only."""

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        return spec_of("sfsf")


class MixedShapesLegacyModel(RecordingModel):
    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        return spec_of("sfsf", head_dims=(16, 32, 16, 32))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hybrid-config")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "max_position_embeddings": 4096,
        "torch_dtype": "float32",
    }))
    return str(path)


def vllm_config_for(model_dir: str, rows: int, num_blocks: int | None = None, batched_tokens: int = 64,
                    prefix_caching: bool = False) -> VllmConfig:
    config = build_vllm_config(SimConfig(max_num_seqs=rows, max_num_batched_tokens=batched_tokens,
                                         max_model_len=MAX_LEN, block_size=BLOCK,
                                         enable_prefix_caching=prefix_caching))
    config.model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=MAX_LEN,
                                      dtype="float32")
    config.cache_config.num_gpu_blocks_override = num_blocks
    return config


def plan_kv(vllm_config: VllmConfig, spec: dict[str, KVCacheSpec], available: int) -> KVCacheConfig:
    """vLLM's engine-core KV planning for one worker (``get_kv_cache_configs``)."""
    if compat.HAS_KV_CACHE_PLANNING:
        from vllm.v1.core import kv_cache_planning as planning

        groups = planning.get_global_kv_cache_groups(vllm_config, [spec])
        return planning.get_kv_cache_configs(vllm_config, [spec], [available], groups)[0]
    from vllm.v1.core import kv_cache_utils as utils  # vLLM 0.31 / 0.32

    return utils.get_kv_cache_configs(vllm_config, [spec], [available])[0]


class Engine:
    """The engine core's loop over one TT runner and the TT phase scheduler."""

    def __init__(self, model_dir: str, model_cls: type, rows: int = 2, num_blocks: int | None = None,
                 prefix_caching: bool = False) -> None:
        self.vllm_config = vllm_config_for(model_dir, rows, num_blocks, prefix_caching=prefix_caching)
        registered = RegisteredModel("TTLlamaForCausalLM", f"{model_cls.__module__}:{model_cls.__qualname__}", "test")
        setup = TTSetup(TTConfig.from_sources({}, {}), registered, registered.capabilities(),
                        Topology(mesh_request({}), 1, rows))
        self.runner = TTModelRunner(self.vllm_config, setup, mesh_device=None)
        self.runner.load_model()
        self.model: RecordingModel = self.runner.model  # type: ignore[assignment]
        spec = self.runner.kv_cache_spec()
        # The engine core's order: the layout, then the worker's memory answer, then the plan.
        resolve_kv_cache_layout(self.vllm_config, [["LBHNC"]], list(spec.values()))
        self.kv_config = plan_kv(self.vllm_config, spec, self.runner.reserve_kv_blocks())
        self.runner.initialize_kv_cache(self.kv_config)
        self.scheduler = TTScheduler(
            vllm_config=self.vllm_config, kv_cache_config=self.kv_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config), block_size=BLOCK,
        )
        self.preempted = 0
        self.block_hasher = None
        if prefix_caching:  # requests carry block hashes, as the engine core computes them
            init_none_hash(sha256)
            self.block_hasher = get_request_block_hasher(BLOCK, sha256)

    def add(self, req_id: str, prompt_len: int, max_tokens: int) -> None:
        prompt = [(i * 5 + len(req_id)) % (VOCAB - 1) + 1 for i in range(prompt_len)]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        self.scheduler.add_request(Request(req_id, prompt, params, None, block_hasher=self.block_hasher))

    def run(self, max_steps: int = 400) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                return
            out = self.scheduler.schedule()
            self.preempted += len(out.preempted_req_ids or ())
            calls = len(self.model.calls)
            self.runner.execute_model(out)
            if len(self.model.calls) > calls:
                coordinator = self.scheduler.kv_cache_manager.coordinator
                call = self.model.calls[-1]
                call.slots = {req_id: self.runner.batch.requests[req_id].slot for req_id in out.num_scheduled_tokens}
                call.vllm_blocks = {
                    req_id: tuple([b.block_id for b in group] for group in coordinator.get_blocks(req_id))
                    for req_id in out.num_scheduled_tokens
                }
            self.scheduler.update_from_output(out, self.runner.sample_tokens(None))
        raise AssertionError("requests did not finish")


def rows_of(engine: Engine, call: Call) -> dict[int, tuple[str, int]]:
    """Table row -> (request, tokens computed before this step) for the call's requests."""
    if call.kind == "prefill":
        starts = [int(s) for s in call.kwargs["start_pos"]]
        return {i: (req_id, starts[i]) for i, req_id in enumerate(call.vllm_blocks)}
    return {slot: (r, int(call.kwargs["start_pos"][slot])) for r, slot in call.slots.items()}


@pytest.fixture(scope="module")
def hybrid_run(model_dir: str) -> Engine:
    engine = Engine(model_dir, HybridModel)
    engine.add("long", 50, 40)    # prefill spans the window; decode slides it past more blocks
    engine.add("short", 5, 60)
    engine.add("late", 21, 30)    # queues until a row frees
    engine.run()
    return engine


def expected_row(engine: Engine, group: int, vllm_ids: list[int], computed: int) -> list[int]:
    """The table row the contract asks for: vLLM's blocks, zero below the window's first block."""
    live = engine.runner.kv.layout.groups[group].first_live_block(computed)  # type: ignore[union-attr]
    row = [0] * engine.runner.table_width
    for j, block in enumerate(vllm_ids[: len(row)]):
        row[j] = block if j >= live else 0
    return row


def test_every_call_gets_per_layer_tables_of_the_decode_trace_shape(hybrid_run: Engine) -> None:
    width = hybrid_run.runner.table_width
    assert width == MAX_LEN // BLOCK
    kinds = {call.kind for call in hybrid_run.model.calls}
    assert kinds == {"prefill", "decode"}
    for call in hybrid_run.model.calls:
        tables = call.kwargs["page_tables_per_layer"]
        assert len(tables) == LAYERS
        assert all(t.dtype == torch.int32 and tuple(t.shape) == (2, width) for t in tables), call.kind
        used = set(rows_of(hybrid_run, call))
        for t in tables:
            for row in set(range(2)) - used:
                assert not t[row].any(), f"{call.kind}: padding row {row} is not all zeros"


def test_tables_are_vllms_blocks_with_the_window_left_behind_zeroed(hybrid_run: Engine) -> None:
    layout = hybrid_run.runner.kv.layout
    assert layout is not None
    zeroed = 0
    for call in hybrid_run.model.calls:
        tables = call.kwargs["page_tables_per_layer"]
        for row, (req_id, computed) in rows_of(hybrid_run, call).items():
            for layer, table in enumerate(tables):
                group = layout.layers[layer].group
                want = expected_row(hybrid_run, group, call.vllm_blocks[req_id][group], computed)
                assert table[row].tolist() == want, f"{call.kind} {req_id} layer {layer} at {computed}"
                if layout.groups[group].kind == "sliding":
                    zeroed += sum(1 for b in want if b == 0) - (hybrid_run.runner.table_width
                                                                  - len(call.vllm_blocks[req_id][group]))
    assert zeroed > 0, "the run never moved a window past a block: the test proves nothing"


def test_live_entries_are_held_blocks_covering_the_window(hybrid_run: Engine) -> None:
    """Inside the window every entry is a real block (never vLLM's null block 0), and no block
    is live twice in one step (freed blocks are reused: a stale id would collide)."""
    layout = hybrid_run.runner.kv.layout
    assert layout is not None
    for call in hybrid_run.model.calls:
        tables = call.kwargs["page_tables_per_layer"]
        seen: dict[int, str] = {}
        ends = call.kwargs["prompt_lens"] if call.kind == "prefill" else None
        for row, (req_id, computed) in rows_of(hybrid_run, call).items():
            end = int(ends[row]) if ends is not None else computed + 1
            for group in layout.groups:
                table = tables[group.layers[0]][row]
                first = max(computed - (WINDOW - 1), 0) if group.kind == "sliding" else 0
                needed = range(first // BLOCK, (end - 1) // BLOCK + 1)
                assert all(int(table[j]) != 0 for j in needed), f"{req_id} group {group.index}: {table.tolist()}"
                for block in table.tolist():
                    if block:
                        owner = f"{req_id}/{group.index}"
                        assert seen.setdefault(block, owner) == owner, f"block {block} live twice: {owner}"


def test_full_layers_get_the_whole_table_and_page_table_is_the_first_group(hybrid_run: Engine) -> None:
    for call in hybrid_run.model.calls:
        tables = call.kwargs["page_tables_per_layer"]
        rows = len(call.kwargs["page_table"])
        assert torch.equal(call.kwargs["page_table"], tables[0][:rows])
        for row, (req_id, _) in rows_of(hybrid_run, call).items():
            full = call.vllm_blocks[req_id][1]
            assert tables[1][row, : len(full)].tolist() == full and all(full)


def test_layers_of_one_group_read_one_table_and_share_storage_as_vllm_placed_them(hybrid_run: Engine) -> None:
    (name, per_layer), = hybrid_run.model.allocations
    assert name == "allocate_kv_cache_per_layer"
    blocks = hybrid_run.kv_config.num_blocks
    assert [spec[0] for spec in per_layer] == [(blocks, 2, BLOCK, 16)] * LAYERS
    assert [spec[2] for spec in per_layer] == [0, 0, 1, 1], "layer i of each group shares one tensor"
    start = {name: t.offset + i * t.layer_stride for t in hybrid_run.kv_config.kv_cache_tensors
             for i, name in enumerate(t.layers)}
    assert start["model.layers.0.self_attn"] == start["model.layers.1.self_attn"]
    assert start["model.layers.0.self_attn"] != start["model.layers.2.self_attn"]
    call = hybrid_run.model.calls[-1]
    tables = call.kwargs["page_tables_per_layer"]
    assert tables[0] is tables[2] and tables[1] is tables[3]


def test_a_three_to_one_pattern_puts_every_layer_in_one_storage_slot(model_dir: str) -> None:
    engine = Engine(model_dir, GemmaLikeModel)
    (_, per_layer), = engine.model.allocations
    assert len(engine.runner.kv.layout.groups) == 4  # type: ignore[union-attr]
    assert [spec[2] for spec in per_layer] == [0, 0, 0, 0]


def test_preempted_requests_resume_with_their_blocks_replaced(model_dir: str) -> None:
    engine = Engine(model_dir, HybridModel, num_blocks=24)  # too few blocks for both requests at once
    engine.add("a", 60, 70)
    engine.add("b", 60, 70)
    engine.run()
    assert engine.preempted > 0, "the pool was big enough: nothing was preempted"
    layout = engine.runner.kv.layout
    assert layout is not None
    for call in engine.model.calls:
        for row, (req_id, computed) in rows_of(engine, call).items():
            for layer, table in enumerate(call.kwargs["page_tables_per_layer"]):
                group = layout.layers[layer].group
                assert table[row].tolist() == expected_row(engine, group, call.vllm_blocks[req_id][group], computed)


def test_a_prefix_cache_hit_starts_past_the_null_blocks_vllm_left_in_the_window(model_dir: str) -> None:
    engine = Engine(model_dir, HybridModel, prefix_caching=True)
    engine.add("a1", 90, 2)
    engine.run()
    first = len(engine.model.calls)
    engine.add("b1", 90, 30)   # the same prompt: vLLM hits the cache past the window
    engine.run()
    layout = engine.runner.kv.layout
    assert layout is not None
    (hit,) = [c for c in engine.model.calls[first:] if c.kind == "prefill"]
    start = int(hit.kwargs["start_pos"][0])
    sliding = hit.vllm_blocks["b1"][0]
    assert start >= 4 * BLOCK and sliding[0] == 0, "no prefix hit with a dropped window head"
    for call in engine.model.calls[first:]:
        for row, (req_id, computed) in rows_of(engine, call).items():
            for layer, table in enumerate(call.kwargs["page_tables_per_layer"]):
                group = layout.layers[layer].group
                assert table[row].tolist() == expected_row(engine, group, call.vllm_blocks[req_id][group], computed)


def test_a_model_without_a_kv_spec_gets_todays_calls(model_dir: str) -> None:
    engine = Engine(model_dir, RecordingModel)
    engine.add("a", 30, 4)
    engine.run()
    assert engine.model.allocations == [("allocate_kv_cache", (engine.kv_config.num_blocks, 2, BLOCK, 16),
                                         torch.float32, LAYERS)]
    assert {c.kind for c in engine.model.calls} == {"prefill", "decode"}
    legacy = {"prefill": {"tokens", "page_table", "kv_cache", "prompt_lens", "start_pos", "empty_slots", "enable_trace"},
              "decode": {"tokens", "start_pos", "page_table", "kv_cache", "enable_trace", "read_from_device"}}
    for call in engine.model.calls:
        assert set(call.kwargs) == legacy[call.kind]
    assert engine.runner.kv.layout is None


def test_uniform_hybrid_specs_allocate_through_the_legacy_call(model_dir: str) -> None:
    engine = Engine(model_dir, UniformHybridLegacyModel)
    assert engine.model.allocations == [("allocate_kv_cache", (engine.kv_config.num_blocks, 2, BLOCK, 16),
                                         torch.float32, LAYERS)]


def test_mixed_shapes_with_only_the_legacy_allocator_name_the_fix(model_dir: str) -> None:
    with pytest.raises(TTUnsupportedFeatureError, match=r"allocate_kv_cache_per_layer\(per_layer_specs\)"):
        Engine(model_dir, MixedShapesLegacyModel)


def test_the_budget_reaches_vllm_as_the_block_count(model_dir: str) -> None:
    engine = Engine(model_dir, HybridModel)
    budget = engine.runner.kv_budget()
    rows = 2  # the recording model has no get_max_tokens_all_users: tt-metal's 131072-token pool
    full, sliding = cdiv(131_072 + BLOCK * rows, BLOCK), rows * (cdiv(WINDOW - 1 + 64, BLOCK) + 1)
    assert [(g.kind, g.blocks) for g in budget.groups] == [("sliding", sliding), ("full", full)]
    assert budget.blocks == full + sliding + 1
    assert engine.kv_config.num_blocks == budget.blocks


def test_a_user_block_count_wins(model_dir: str) -> None:
    engine = Engine(model_dir, HybridModel, num_blocks=40)
    assert engine.kv_config.num_blocks == 40


def test_without_a_spec_the_budget_is_todays(model_dir: str) -> None:
    engine = Engine(model_dir, RecordingModel)
    assert engine.kv_config.num_blocks == cdiv(131_072 + BLOCK * 2, BLOCK) + 1


def test_update_max_model_len_reaches_the_runner(model_dir: str) -> None:
    engine = Engine(model_dir, HybridModel)
    worker = object.__new__(TTWorker)
    worker.vllm_config = engine.vllm_config
    worker._runner = engine.runner
    worker.update_max_model_len(100)
    assert engine.runner.table_width == cdiv(100, BLOCK)
    assert engine.vllm_config.model_config.max_model_len == 100


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_lane_numbered_blocks_become_lane_local_in_every_group() -> None:
    """With lanes, the scheduler numbers a lane's blocks ``lane * blocks_per_lane + local`` (its
    null block too); every layer's table holds the local ids, by global slot."""
    from vllm_tt_platform.runner.batch import PersistentBatch
    from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout, LayerKV
    from vllm_tt_platform.runner.step import DecodeInputs, PrefillInputs, ScheduledRow

    per_lane = 50
    shape = (per_lane, 2, BLOCK, 16)
    layout = KVLayout(
        (KVGroup(0, (0,), BLOCK, WINDOW, WINDOW - 1), KVGroup(1, (1,), BLOCK, None)),
        (LayerKV(0, shape, torch.float32, 0), LayerKV(1, shape, torch.float32, 0)),
    )
    batch = PersistentBatch(lanes=2, rows_per_lane=1)
    lane1 = per_lane
    state = batch.add("a", list(range(1, 60)), SamplingParams(max_tokens=4),
                      [[lane1 + 0, lane1 + 0, lane1 + 7, lane1 + 8], [lane1 + 3, lane1 + 4, lane1 + 5, lane1 + 6]],
                      num_computed_tokens=0, lane=1)
    state.num_computed_tokens = 59
    state.output_token_ids.append(9)
    decode = DecodeInputs.build([ScheduledRow(state, 1)], 2, 8, per_lane, layout)
    assert decode.page_tables_per_layer is not None
    sliding, full = decode.page_tables_per_layer
    assert state.slot == 1 and not sliding[0].any() and not full[0].any()
    assert sliding[1].tolist() == [0, 0, 7, 8, 0, 0, 0, 0]  # 59 - 19 = 40: the window starts in block 2
    assert full[1].tolist() == [3, 4, 5, 6, 0, 0, 0, 0]
    state.num_computed_tokens = 0
    prefill = PrefillInputs.build([ScheduledRow(state, 59)], 8, per_lane, layout, decode_rows=2)
    assert prefill.page_tables_per_layer is not None
    assert [tuple(t.shape) for t in prefill.page_tables_per_layer] == [(2, 8), (2, 8)]
    assert prefill.page_tables_per_layer[0][0].tolist() == [0, 0, 7, 8, 0, 0, 0, 0]  # row 0: the call's first
    assert not prefill.page_tables_per_layer[0][1].any()
    assert torch.equal(prefill.page_table, prefill.page_tables_per_layer[0][:1])


# ---- latent attention (MLA): one latent per token, one group --------------------------------

LATENT = 48
"""``kv_lora_rank + qk_rope_head_dim`` of the MLA test model."""


class LatentModel(HybridModel):
    """Declares multi-head latent attention on every layer (DeepSeek V3's spec)."""

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=LATENT, dtype=torch.float32)
        return {f"model.layers.{i}.self_attn": spec for i in range(LAYERS)}


class LatentLegacyModel(RecordingModel):
    """Declares MLA but allocates through the legacy call only (every layer has one shape)."""

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        return LatentModel.get_kv_cache_spec(vllm_config)


def test_an_mla_group_is_sized_like_full_attention_at_one_latent_per_token(model_dir: str) -> None:
    engine = Engine(model_dir, LatentModel)
    budget = engine.runner.kv_budget()
    assert [(g.kind, g.num_layers, g.blocks) for g in budget.groups] == [("mla", LAYERS, cdiv(131_072 + BLOCK * 2, BLOCK))]
    assert budget.bytes_per_block == LAYERS * BLOCK * LATENT * 4  # no separate V
    assert engine.kv_config.num_blocks == budget.blocks
    layout = engine.runner.kv.layout
    assert layout is not None and [g.kind for g in layout.groups] == ["mla"]
    assert "mla layers [0, 1, 2, 3]" in layout.describe()


def test_an_mla_group_allocates_one_latent_tensor_per_layer(model_dir: str) -> None:
    engine = Engine(model_dir, LatentModel)
    (_, per_layer), = engine.model.allocations
    shape = (engine.kv_config.num_blocks, 1, BLOCK, LATENT)
    assert per_layer == [(shape, torch.float32, i) for i in range(LAYERS)]
    legacy = Engine(model_dir, LatentLegacyModel)
    assert legacy.model.allocations == [("allocate_kv_cache", (legacy.kv_config.num_blocks, 1, BLOCK, LATENT),
                                         torch.float32, LAYERS)]


def test_an_mla_group_pages_every_layer_through_vllms_blocks_under_preemption(model_dir: str) -> None:
    engine = Engine(model_dir, LatentModel, num_blocks=18)  # too few blocks for both requests at once
    engine.add("a", 60, 70)
    engine.add("b", 60, 70)
    engine.run()
    assert engine.preempted > 0, "the pool was big enough: nothing was preempted"
    for call in engine.model.calls:
        for row, (req_id, computed) in rows_of(engine, call).items():
            expected = expected_row(engine, 0, call.vllm_blocks[req_id][0], computed)
            assert 0 not in expected[: cdiv(computed + 1, BLOCK)]  # nothing of an MLA group is dropped
            for table in call.kwargs["page_tables_per_layer"]:
                assert table[row].tolist() == expected


# ---- KV-shared layers (Gemma 4's num_kv_shared_layers) -------------------------------------

SHARING = {"model.layers.2.self_attn": "model.layers.0.self_attn", "model.layers.3.self_attn": "model.layers.1.self_attn"}


class SharingModel(HybridModel):
    """Layer 0 (sliding, 2 KV heads x 16) and layer 1 (full, 1 KV head x 32: another shape, the
    same page size) own KV; layer 2 reads layer 0's, layer 3 layer 1's, as vLLM's attention
    layers name a ``kv_sharing_target_layer_name``."""

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        return {
            "model.layers.0.self_attn": spec_of("s")["model.layers.0.self_attn"],
            "model.layers.1.self_attn": FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=32,
                                                          dtype=torch.float32),
        }

    @classmethod
    def get_kv_sharing_targets(cls, vllm_config: Any) -> dict[str, str]:
        return dict(SHARING)


class ChainedSharingModel(SharingModel):
    @classmethod
    def get_kv_sharing_targets(cls, vllm_config: Any) -> dict[str, str]:
        return {**SHARING, "model.layers.3.self_attn": "model.layers.2.self_attn"}


class SharedLayerWithSpecModel(SharingModel):
    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, KVCacheSpec]:
        return {**super().get_kv_cache_spec(vllm_config), "model.layers.2.self_attn": spec_of("s")["model.layers.0.self_attn"]}


def test_kv_shared_layers_get_their_targets_storage_and_tables_under_preemption(model_dir: str) -> None:
    """vLLM plans only the two owning layers; the shared ones are allocated on their target's
    tensor index with its shape and receive its group's table object on every call, through
    window moves and preemption."""
    engine = Engine(model_dir, SharingModel, num_blocks=24)  # too few blocks for both requests at once
    planned = sorted(name for group in engine.kv_config.kv_cache_groups for name in group.layer_names)
    assert planned == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    engine.add("a", 60, 70)
    engine.add("b", 60, 70)
    engine.run()
    assert engine.preempted > 0, "the pool was big enough: nothing was preempted"
    (name, per_layer), = engine.model.allocations
    blocks = engine.kv_config.num_blocks
    assert [spec[0] for spec in per_layer] == [(blocks, 2, BLOCK, 16), (blocks, 1, BLOCK, 32)] * 2
    assert per_layer[2] == per_layer[0] and per_layer[3] == per_layer[1]
    layout = engine.runner.kv.layout
    assert layout is not None
    assert [g.layers for g in layout.groups] == [(0, 2), (1, 3)]
    assert "layer 2 reads layer 0's KV; layer 3 reads layer 1's KV" in layout.describe()
    assert layout.block_tokens() == str(layout.groups[0].block_size)  # one size: one number
    for call in engine.model.calls:
        tables = call.kwargs["page_tables_per_layer"]
        assert tables[2] is tables[0] and tables[3] is tables[1], call.kind
        for row, (req_id, computed) in rows_of(engine, call).items():
            for layer, table in enumerate(tables):
                group = layout.layers[layer].group
                assert table[row].tolist() == expected_row(engine, group, call.vllm_blocks[req_id][group], computed)


def test_kv_shared_layers_cost_no_blocks(model_dir: str) -> None:
    """The budget and vLLM's pool count the owning layers only: one layer per group, so a block
    costs one layer's page, half of what the same kinds cost with every layer owning its KV."""
    shared, owning = Engine(model_dir, SharingModel).runner.kv_budget(), Engine(model_dir, HybridModel).runner.kv_budget()
    assert [(g.kind, g.num_layers) for g in shared.groups] == [("sliding", 1), ("full", 1)]
    assert [(g.kind, g.num_layers) for g in owning.groups] == [("sliding", 2), ("full", 2)]
    assert shared.bytes_per_block == 2 * BLOCK * 32 * 4 == owning.bytes_per_block // 2
    assert shared.blocks == owning.blocks


@pytest.mark.parametrize(("model_cls", "match"), [
    (ChainedSharingModel, r"get_kv_sharing_targets\(\) layers"),
    (SharedLayerWithSpecModel, r"get_kv_cache_spec\(\) layers"),
])
def test_kv_sharing_that_vllm_cannot_plan_is_refused_by_name(model_dir: str, model_cls: type, match: str) -> None:
    with pytest.raises(TTUnsupportedFeatureError, match=match):
        Engine(model_dir, model_cls)
