"""The host XLM-RoBERTa encoder against transformers on the tiny seeded reranker
(``XLMRobertaForSequenceClassification``, bge-reranker-v2-m3's shape): a padded batch of
(query, document) pairs gives transformers' logits (scores within 1e-5), its encoder (``XLMRobertaModel``) the same
hidden states (within 1e-4, as BERT's), positions start at ``pad_token_id + 1``, and a length past them is refused."""

from __future__ import annotations

import pytest
import torch
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.bert.model import HostXLMRobertaForSequenceClassification, HostXLMRobertaModel
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.tiny_bert import MAX_POSITIONS, inputs_of_lengths, tiny_xlmr_cross_encoder

QUERY = "the fog in the low fields"
BATCH, LENGTH = 8, 96


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_xlmr_cross_encoder()


@pytest.fixture(scope="module")
def hf_config(checkpoint):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def pairs(checkpoint):
    """Six pairs of different lengths, right-padded into a batch of 8 (two padding rows)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(checkpoint)([QUERY] * 6, inputs_of_lengths(6, growth=4)).input_ids
    tokens = torch.zeros(BATCH, LENGTH, dtype=torch.int64)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = torch.tensor(seq)
    return ids, tokens, torch.tensor([len(s) for s in ids] + [0] * (BATCH - len(ids)))


def _host(cls, hf_config, max_seq_len=MAX_POSITIONS):
    return cls.initialize_vllm_model(hf_config, HostMeshDevice(MeshShape(1, 1)), BATCH, max_seq_len)


def test_logits_equal_transformers(checkpoint, hf_config, pairs):
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32).eval()
    assert type(hf).__name__ == "XLMRobertaForSequenceClassification"
    ids, tokens, lens = pairs
    logits = _host(HostXLMRobertaForSequenceClassification, hf_config).pool_forward(tokens=tokens, prompt_lens=lens)
    with torch.inference_mode():
        want = torch.cat([hf(input_ids=torch.tensor([seq])).logits for seq in ids])
    assert logits.shape == (BATCH, 1)
    # float32 sums in another order: logits near 2 differ by up to 1.5e-5; the scores by less.
    torch.testing.assert_close(logits[: len(ids)], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[: len(ids)].sigmoid(), want.sigmoid(), atol=1e-5, rtol=0)


def test_encoder_hidden_states_equal_transformers(checkpoint, hf_config, pairs):
    from transformers import XLMRobertaModel

    hf = XLMRobertaModel.from_pretrained(checkpoint, dtype=torch.float32, add_pooling_layer=False).eval()
    ids, tokens, lens = pairs
    hidden = _host(HostXLMRobertaModel, hf_config).pool_forward(tokens=tokens, prompt_lens=lens)
    for row, seq in enumerate(ids):
        with torch.inference_mode():
            want = hf(input_ids=torch.tensor([seq])).last_hidden_state[0]
        torch.testing.assert_close(hidden[row, : len(seq)], want, atol=1e-4, rtol=1e-4)  # the BERT test's bound


def test_positions_start_past_the_padding_index(hf_config):
    model = _host(HostXLMRobertaModel, hf_config)
    assert hf_config.pad_token_id == 1
    assert model.config.position_offset == 2
    assert model.config.max_length == hf_config.max_position_embeddings - 2 == MAX_POSITIONS


def test_a_length_past_the_position_table_is_refused(hf_config):
    with pytest.raises(HostModelInputError, match=rf"max_seq_len {MAX_POSITIONS + 1} exceeds the {MAX_POSITIONS} "
                                                  rf"positions.*--max-model-len {MAX_POSITIONS} or less"):
        _host(HostXLMRobertaModel, hf_config, max_seq_len=MAX_POSITIONS + 1)
