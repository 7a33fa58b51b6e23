"""The host DeepSeek V3's MTP module (``frame.mtp``) against the same module in transformers'
modules, read back from the checkpoint's saved MTP tensors (``tiny_mtp.MtpHead``): after a
prefill, ``mtp_forward`` drafts what the module predicts from transformers' target hidden
states (the first draft) and from its own output (the chained second); a checkpoint without
MTP weights has no module and is refused when MTP is asked for."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.deepseek_v3.model import HostDeepseekV3ForCausalLM
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.checkpoints import MTP_TARGET_STEPS, cached_mtp, cached_tiny
from vllm_tt_testing.tiny_mtp import MtpHead

BLOCK = 16
WIDTH = 8
ROWS = 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return MtpHead.from_checkpoint(cached_mtp(), tmp_path_factory.mktemp("mtp-block"))


def _model(folder):
    return HostDeepseekV3ForCausalLM.initialize_vllm_model(
        AutoConfig.from_pretrained(folder), HostMeshDevice(MeshShape(1, 1)), ROWS, BLOCK * WIDTH)


def test_drafts_match_the_module_in_transformers(reference):
    target, head = reference
    model = _model(cached_mtp())
    config = model.config
    kv = model.allocate_kv_cache((ROWS * WIDTH + 1, 1, BLOCK, config.head_dim), torch.float32, config.num_layers)
    mtp_kv = model.allocate_mtp_kv_cache((ROWS * WIDTH + 1, 1, BLOCK, config.head_dim), torch.float32)
    table = torch.arange(1, ROWS * WIDTH + 1, dtype=torch.int32).view(ROWS, WIDTH)
    prompts = [[0, 57, 311, 94, 120, 8, 433, 60, 75, 19, 200], [0, 12, 19, 500, 31, 7, 64]]
    tokens = torch.zeros(ROWS, max(map(len, prompts)), dtype=torch.int32)
    for r, p in enumerate(prompts):
        tokens[r, : len(p)] = torch.tensor(p)
    logits = model.prefill_forward(tokens=tokens, page_table=table, kv_cache=kv,
                                   prompt_lens=torch.tensor([len(p) for p in prompts]), empty_slots=[0, 1])
    nxt = logits[:, 0].argmax(-1).tolist()
    fed = [p[1:] + [t] for p, t in zip(prompts, nxt, strict=True)]
    width = max(map(len, fed))
    feed = torch.zeros(ROWS, width, dtype=torch.int32)
    for r, f in enumerate(fed):
        feed[r, : len(f)] = torch.tensor(f)
    drafts = model.mtp_forward(tokens=feed, start_pos=torch.zeros(ROWS, dtype=torch.int32),
                               num_valid_tokens=torch.tensor([len(f) for f in fed]), page_table=table,
                               kv_cache=mtp_kv, num_drafts=2)
    for r, (p, f) in enumerate(zip(prompts, fed, strict=True)):
        assert drafts[r].tolist() == head.greedy_drafts(target, p, f, 2), r


def test_a_checkpoint_without_mtp_weights_is_refused_when_it_loads():
    """Its config may declare an MTP layer (transformers' default does): the runner's drafter
    refuses it by the setting, and so does the model if asked for MTP pages."""
    from types import SimpleNamespace

    from vllm_tt_platform.runner.mtp import MtpDrafts

    model = _model(cached_tiny("deepseek_v3", MTP_TARGET_STEPS))
    assert model.mtp_layers == 0
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(model="tiny-deepseek", max_model_len=128),
                                  cache_config=SimpleNamespace(block_size=BLOCK))
    with pytest.raises(TTConfigError, match="--speculative-config method"):
        MtpDrafts(vllm_config, model, None, 1, ROWS)  # type: ignore[arg-type]
    with pytest.raises(TTConfigError, match="--speculative-config method"):
        model.allocate_mtp_kv_cache((9, 1, BLOCK, model.config.head_dim), torch.float32)
