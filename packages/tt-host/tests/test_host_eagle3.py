"""The host Llama's EAGLE-3 head (``frame.eagle3``) against the head in plain torch over
transformers' hidden states of the target (``tiny_eagle3.Eagle3Head``, read back from the saved
checkpoint): after a prefill, ``eagle3_forward``'s first draft is what the head predicts from
transformers' auxiliary hidden states, and its chained drafts what it predicts from its own
output hidden and its last draft; the same after a decode step continues the row; a head that
does not fit the target is refused naming the setting."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.llama.model import HostLlamaForCausalLM
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.checkpoints import cached_eagle3
from vllm_tt_testing.tiny_eagle3 import AUX_LAYER_IDS, Eagle3Head, aux_hidden_states

BLOCK = 16
WIDTH = 8
ROWS = 2
K = 3
PROMPTS = [[0, 57, 311, 94, 120, 8, 433, 60, 75, 19, 200], [0, 12, 19, 500, 31, 7, 64]]


@pytest.fixture(scope="module")
def checkpoints():
    target_dir, head_dir = cached_eagle3()
    assert json.loads((target_dir / "config.json").read_text())["model_type"] == "llama"  # the family proven
    return target_dir, head_dir


@pytest.fixture(scope="module")
def reference(checkpoints):
    target_dir, head_dir = checkpoints
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    return target, Eagle3Head.from_checkpoint(head_dir, target)


def _model(target_dir):
    return HostLlamaForCausalLM.initialize_vllm_model(
        AutoConfig.from_pretrained(target_dir), HostMeshDevice(MeshShape(1, 1)), ROWS, BLOCK * WIDTH)


def _oracle_drafts(target, head, tokens: list[int], k: int) -> list[int]:
    """The head's ``k`` chained greedy drafts after ``tokens`` (the last one not yet read by the
    target): its step ``s`` at the last position reads its own hidden and its previous draft."""
    with torch.no_grad():
        aux = aux_hidden_states(target, torch.tensor([tokens[:-1]]))
        fed = list(tokens[1:])
        for s in range(k):
            logits = head.chain(torch.tensor([fed]), aux, s + 1)[s][0, -1]
            fed.append(int(head.draft_ids[logits.argmax()]))
    return fed[len(tokens) - 1 :]


def test_chained_drafts_match_the_head_over_transformers_hidden_states(checkpoints, reference):
    target, head = reference
    model = _model(checkpoints[0])
    config = model.config
    kv = model.allocate_kv_cache((ROWS * WIDTH + 1, 1, BLOCK, config.head_dim), torch.float32, config.num_layers)
    head_kv = model.allocate_eagle3_kv_cache(str(checkpoints[1]), AUX_LAYER_IDS,
                                             (ROWS * WIDTH + 1, 1, BLOCK, config.head_dim), torch.float32)
    table = torch.arange(1, ROWS * WIDTH + 1, dtype=torch.int32).view(ROWS, WIDTH)
    tokens = torch.zeros(ROWS, max(map(len, PROMPTS)), dtype=torch.int32)
    for r, p in enumerate(PROMPTS):
        tokens[r, : len(p)] = torch.tensor(p)
    logits = model.prefill_forward(tokens=tokens, page_table=table, kv_cache=kv,
                                   prompt_lens=torch.tensor([len(p) for p in PROMPTS]), empty_slots=[0, 1])
    rows = [p + [int(t)] for p, t in zip(PROMPTS, logits[:, 0].argmax(-1).tolist(), strict=True)]
    drafts = _drafts(model, head_kv, table, rows, [0] * ROWS)
    assert drafts == [_oracle_drafts(target, head, row, K) for row in rows]
    # One decode step later the head catches up on the new position (its KV rewritten there).
    step = model.decode_forward(tokens=torch.tensor([[row[-1]] for row in rows], dtype=torch.int32),
                                start_pos=torch.tensor([len(row) - 1 for row in rows], dtype=torch.int32),
                                page_table=table, kv_cache=kv)
    starts = [len(row) - 1 for row in rows]
    rows = [row + [int(t)] for row, t in zip(rows, step[:, 0].argmax(-1).tolist(), strict=True)]
    drafts = _drafts(model, head_kv, table, rows, starts)
    assert drafts == [_oracle_drafts(target, head, row, K) for row in rows]


def _drafts(model, head_kv, table, rows: list[list[int]], starts: list[int]) -> list[list[int]]:
    """``eagle3_forward`` over each row's tokens after position ``starts[r]``."""
    fed = [row[s + 1 :] for row, s in zip(rows, starts, strict=True)]
    feed = torch.zeros(ROWS, max(map(len, fed)), dtype=torch.int32)
    for r, f in enumerate(fed):
        feed[r, : len(f)] = torch.tensor(f)
    out = model.eagle3_forward(tokens=feed, start_pos=torch.tensor(starts, dtype=torch.int32),
                               num_valid_tokens=torch.tensor([len(f) for f in fed]), page_table=table,
                               kv_cache=head_kv, num_drafts=K)
    return out.tolist()


def test_the_target_keeps_the_auxiliary_states_of_the_named_layers(checkpoints, reference):
    """What the prefill keeps per position is transformers' residual stream entering each
    named layer (id ``num_hidden_layers``: the last layer's output before the final norm)."""
    target, _ = reference
    model = _model(checkpoints[0])
    config = model.config
    kv = model.allocate_kv_cache((WIDTH + 1, 1, BLOCK, config.head_dim), torch.float32, config.num_layers)
    model.allocate_eagle3_kv_cache(str(checkpoints[1]), AUX_LAYER_IDS, (WIDTH + 1, 1, BLOCK, config.head_dim), torch.float32)
    prompt = PROMPTS[0]
    model.prefill_forward(tokens=torch.tensor([prompt], dtype=torch.int32), page_table=torch.arange(1, WIDTH + 1)[None],
                          kv_cache=kv, prompt_lens=torch.tensor([len(prompt)]), empty_slots=[0])
    _, kept = model.retained.take(0, 0, len(prompt))
    expected = aux_hidden_states(target, torch.tensor([prompt]))[0]
    torch.testing.assert_close(kept, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("edit", "setting"), [
    (lambda c: c.update(num_hidden_layers=2), "num_hidden_layers"),
    (lambda c: c.update(norm_before_residual=True), "norm_before_residual"),
    (lambda c: c.update(hidden_size=64), "target_hidden_size"),
    (lambda c: c.update(hidden_size=64, target_hidden_size=128), "fc.weight"),
])
def test_a_head_that_does_not_fit_is_refused_naming_the_setting(checkpoints, tmp_path, edit, setting):
    target_dir, head_dir = checkpoints
    bad = tmp_path / "head"
    shutil.copytree(head_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    edit(config)
    (bad / "config.json").write_text(json.dumps(config))
    model = _model(target_dir)
    with pytest.raises(TTConfigError, match=setting):
        model.allocate_eagle3_kv_cache(str(bad), AUX_LAYER_IDS, (9, 1, BLOCK, model.config.head_dim), torch.float32)
    with pytest.raises(TTConfigError, match="eagle_aux_hidden_state_layer_ids"):
        model.allocate_eagle3_kv_cache(str(head_dir), (0, 1, 3), (9, 1, BLOCK, model.config.head_dim), torch.float32)
