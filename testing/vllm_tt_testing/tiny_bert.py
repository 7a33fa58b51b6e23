"""Tiny BERT-style checkpoints built from nothing: a WordPiece tokenizer trained on the host
package's corpus (``[CLS] text [SEP]``, lower-cased, as BERT's), a 2-layer ``BertModel`` with
seeded random weights, saved with ``save_pretrained`` so vLLM and transformers load it offline;
and their XLM-RoBERTa twins (a Unigram tokenizer, ``<s> a </s></s> b </s>`` as XLM-R's, one
token type, positions from ``pad_token_id + 1``).

Random weights are enough for pooling parity: every input gets its own vector (see ``RECIPE``), and the
transformers model of the same folder is the oracle (``hf_embeddings``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_tt_testing.checkpoints import cached
from vllm_tt_testing.tiny_vl import built, save

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
"""XLM-R's first ids (``<pad>`` is 1: its position table starts at row 2)."""
VOCAB = 1024
MAX_POSITIONS = 128
STAMP = ".vllm-tt-tiny-bert.json"
RECIPE: dict[str, Any] = {"format": 1, "vocab": VOCAB, "hidden": 64, "layers": 2, "heads": 4, "intermediate": 128,
          "max_positions": MAX_POSITIONS, "init_std": 0.5, "seed": 0}
"""``init_std`` 0.5, not BERT's 0.02: at 0.02 a random encoder gives every input nearly the same
CLS vector (pairwise cosine 0.99999), which would make a cosine parity check meaningless; at
0.5 the 16 parity inputs are at most 0.84 apart."""


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=list(SPECIALS), show_progress=False)
    tok.train_from_iterator(_paragraphs(), trainer=trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False,
    )


def build_xlmr_tokenizer() -> Any:
    """A Unigram (SentencePiece-style) tokenizer with XLM-R's specials and pair template; like
    XLM-R's, it sends no token types."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=list(XLMR_SPECIALS), unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(_paragraphs(), trainer=trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
        pad_token="<pad>", cls_token="<s>", mask_token="<mask>", model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "attention_mask"], clean_up_tokenization_spaces=False,
    )


def _paragraphs() -> list[str]:
    import vllm_tt_host.tiny as tiny

    return [p for p in tiny.corpus_text().split("\n\n") if p.strip()]


def _build(out: Path, arch: str, recipe: dict[str, Any]) -> Path:
    """Write the ``arch`` checkpoint of ``recipe`` into ``out`` (idempotent: a matching stamp
    means it is there)."""
    if built(out, STAMP, recipe):
        return out
    import torch
    import transformers

    xlmr = arch.startswith("XLMRoberta")
    tokenizer = build_xlmr_tokenizer() if xlmr else build_tokenizer()
    # XLM-R's position table has pad_token_id + 1 rows before the first token's.
    positions = MAX_POSITIONS + tokenizer.pad_token_id + 1 if xlmr else MAX_POSITIONS
    config = (transformers.XLMRobertaConfig if xlmr else transformers.BertConfig)(
        vocab_size=len(tokenizer), hidden_size=recipe["hidden"], num_hidden_layers=recipe["layers"],
        num_attention_heads=recipe["heads"], intermediate_size=recipe["intermediate"],
        max_position_embeddings=positions, type_vocab_size=1 if xlmr else 2, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, architectures=[arch],
        initializer_range=recipe["init_std"],
    )
    config.num_labels = recipe.get("labels", 2)
    if xlmr:  # as bge-m3's config.json: vLLM's XLMRobertaModel config hook reads it, transformers 5 dropped it
        config.position_embedding_type = "absolute"
    torch.manual_seed(recipe["seed"])
    model_cls = getattr(transformers, arch)
    encoder = arch in ("BertModel", "XLMRobertaModel")  # embedding checkpoints: no pooler head
    model = (model_cls(config, add_pooling_layer=False) if encoder else model_cls(config)).eval()
    return save(out, model, tokenizer, STAMP, recipe)


def tiny_bert() -> Path:
    """The cached tiny BERT embedding checkpoint folder (``BertModel``)."""
    return cached("tiny-bert", lambda out: _build(out, "BertModel", RECIPE), RECIPE)


XLMR_RECIPE: dict[str, Any] = {**RECIPE, "arch": "XLMRobertaModel", "seed": 3}
"""bge-m3's dense-vector encoder shape at tiny size."""


def tiny_xlmr() -> Path:
    """The cached tiny XLM-R embedding checkpoint folder (``XLMRobertaModel``)."""
    return cached("tiny-xlmr", lambda out: _build(out, "XLMRobertaModel", XLMR_RECIPE), XLMR_RECIPE)


CROSS_ENCODER_RECIPE: dict[str, Any] = {**RECIPE, "labels": 1, "seed": 1}
"""One label: a reranker's relevance logit (vLLM and sentence-transformers apply a sigmoid)."""


def tiny_cross_encoder() -> Path:
    """The cached tiny cross-encoder reranker (``BertForSequenceClassification``, one label)."""
    return cached("tiny-bert-cross-encoder",
                  lambda out: _build(out, "BertForSequenceClassification", CROSS_ENCODER_RECIPE),
                  CROSS_ENCODER_RECIPE)


XLMR_CROSS_ENCODER_RECIPE: dict[str, Any] = {**CROSS_ENCODER_RECIPE, "arch": "XLMRobertaForSequenceClassification"}
"""bge-reranker-v2-m3's shape at tiny size: an XLM-R encoder and one relevance label."""


def tiny_xlmr_cross_encoder() -> Path:
    """The cached tiny XLM-R cross-encoder reranker (``XLMRobertaForSequenceClassification``, one label)."""
    return cached("tiny-xlmr-cross-encoder",
                  lambda out: _build(out, "XLMRobertaForSequenceClassification", XLMR_CROSS_ENCODER_RECIPE),
                  XLMR_CROSS_ENCODER_RECIPE)


CLASSIFIER_RECIPE: dict[str, Any] = {**RECIPE, "labels": 3, "seed": 2}
"""Three labels: a sequence classifier (``/classify``, vLLM's softmax over the labels)."""


def tiny_classifier() -> Path:
    """The cached tiny sequence classifier (``BertForSequenceClassification``, three labels)."""
    return cached("tiny-bert-classifier",
                  lambda out: _build(out, "BertForSequenceClassification", CLASSIFIER_RECIPE),
                  CLASSIFIER_RECIPE)


def hf_class_probs(folder: Path, texts: Sequence[str]) -> Any:
    """transformers' label probabilities of ``texts``: softmax of the logits (float32 ``[n, labels]``)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.inference_mode():
        return torch.softmax(model(**batch).logits, dim=-1)


def hf_scores(folder: Path, query: str, documents: Sequence[str]) -> Any:
    """transformers' relevance scores of ``(query, document)`` pairs: sigmoid of the logit (float32 ``[n]``)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tokenizer([query] * len(documents), list(documents), padding=True, return_tensors="pt")
    with torch.inference_mode():
        return torch.sigmoid(model(**batch).logits[:, 0])


def inputs_of_lengths(count: int = 16, growth: int = 6) -> list[str]:
    """``count`` corpus snippets of different lengths (2, 2 + growth, ... words), for parity
    runs (with the defaults, 4 to 126 tokens)."""
    import vllm_tt_host.tiny as tiny

    words = tiny.corpus_text().split()
    return [" ".join(words[7 * i: 7 * i + 2 + growth * i]) for i in range(count)]


def hf_embeddings(folder: Path, texts: Sequence[str], pooling: str = "CLS") -> Any:
    """transformers' pooled, L2-normalised vectors of ``texts`` (float32 ``[n, hidden]``): the oracle."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, add_pooling_layer=False).eval()
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    if pooling == "CLS":
        pooled = hidden[:, 0]
    else:
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, p=2, dim=-1)
