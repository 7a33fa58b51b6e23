"""The host BERT encoder against transformers' ``BertModel`` on the tiny seeded checkpoint:
hidden states of padded batches equal transformers' per real position, and traced calls run
only at the shapes warmup captured."""

from __future__ import annotations

import pytest
import torch
from vllm_tt_host.device import HostMeshDevice, TraceNotCapturedError
from vllm_tt_host.models.bert.model import HostBertModel
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.tiny_bert import inputs_of_lengths, tiny_bert


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_bert()


@pytest.fixture(scope="module")
def model(checkpoint):
    from transformers import AutoConfig

    return HostBertModel.initialize_vllm_model(AutoConfig.from_pretrained(checkpoint),
                                               HostMeshDevice(MeshShape(1, 1)), 4, 128)


def _batch(checkpoint, texts, length):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(checkpoint)(texts).input_ids
    tokens = torch.zeros(4, length, dtype=torch.int64)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = torch.tensor(seq)
    return ids, tokens, torch.tensor([len(s) for s in ids] + [0] * (4 - len(ids)))


def test_hidden_states_equal_transformers_per_real_position(checkpoint, model):
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(checkpoint, dtype=torch.float32, add_pooling_layer=False).eval()
    texts = inputs_of_lengths(3, growth=10)
    ids, tokens, lens = _batch(checkpoint, texts, 64)  # row 3 is padding
    hidden = model.pool_forward(tokens=tokens, prompt_lens=lens)
    for row, seq in enumerate(ids):
        with torch.inference_mode():
            want = hf(input_ids=torch.tensor([seq])).last_hidden_state[0]
        torch.testing.assert_close(hidden[row, : len(seq)], want, atol=1e-4, rtol=1e-4)


def test_traced_calls_run_only_at_captured_shapes(checkpoint, model):
    _, tokens, lens = _batch(checkpoint, ["a short one"], 32)
    model.warmup_model_pool(shapes=[(4, 32)], enable_trace=True)
    model.pool_forward(tokens=tokens, prompt_lens=lens, enable_trace=True)
    with pytest.raises(TraceNotCapturedError, match=r"length=32, batch=2.*captured: pool\[len=32,batch=4\]"):
        model.pool_forward(tokens=tokens[:2], prompt_lens=lens[:2], enable_trace=True)
