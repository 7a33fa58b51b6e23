"""``vllm-tt-tiny-model``: write a tiny, real Hugging Face checkpoint without any download.

The host mesh backend serves real checkpoints; tests, CI and the README demo need one that is
small enough for two CPU cores and built from nothing but this package. The tokenizer is a
byte-level BPE trained on ``corpus.txt`` (our own prose); the weights are a seeded transformers
model of the chosen family, optionally trained a little on the same corpus so output reads like
text.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from vllm_tt_host.progress import TrainingProgress

TINY_FORMAT = 1
"""Bump when the files written for the same recipe change, so stale stamps rebuild."""

STAMP_FILE = ".vllm-tt-tiny.json"

ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "gemma4": "Gemma4ForCausalLM",
    "gemma4_e": "Gemma4ForCausalLM",
    "gemma4_moe": "Gemma4ForCausalLM",
    "gemma4_pages": "Gemma4ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "qwen3_5": "Qwen3_5ForCausalLM",
}
"""``--arch`` value -> the HF architecture written to ``config.json``."""

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)
"""Special tokens get the first ids, in this order (bos=0, eos=1, pad=2)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

TOKENIZER_VOCAB = 1024
MAX_POSITIONS = 4096
TRAIN_SEQ_LEN = 64
TRAIN_BATCH = 16
TRAIN_LR = 3e-3

_COMMON_DIMS: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": MAX_POSITIONS,
}

# Gemma 4 text shape (E2B-like KV, no per-layer embeddings or experts): sliding layers of
# 2 KV heads x 32 and full layers of their own head size (global_head_dim 64) with one KV
# head whose values are its keys (attention_k_eq_v), proportional rope on a quarter of the
# full head, and the last two layers (one of each kind) reading the KV of the last earlier
# layer of their kind (num_kv_shared_layers). Both kinds cost 64 values per token, so
# vLLM's hybrid manager pools them without resizing blocks.
_GEMMA4: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "num_hidden_layers": 6,
    "head_dim": 32,
    "global_head_dim": 64,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "num_kv_shared_layers": 2,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "full_attention"],
    "sliding_window": 32,
    "final_logit_softcapping": 30.0,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": TOKENIZER_VOCAB,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
}


_ARCH_CONFIG: dict[str, dict[str, Any]] = {
    # Llama 3.x shape: llama3 rope scaling (all three frequency bands are hit at head_dim 32
    # with an original context of 1024) and tied embeddings, like Llama 3.2 1B.
    "llama": {
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    },
    # Mistral v0.2+ shape: full attention (no sliding window), explicit head_dim.
    "mistral": {
        "rms_norm_eps": 1e-5,
        "head_dim": 32,
        "sliding_window": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Qwen 2 shape: q/k/v bias, tied embeddings like Qwen2.5 0.5B.
    "qwen2": {
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Qwen 3 shape: per-head q/k RMSNorm and a head_dim that is not hidden/heads.
    "qwen3": {
        "rms_norm_eps": 1e-6,
        "head_dim": 48,
        "use_sliding_window": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Gemma 3 text shape: two sliding-window layers and a global one, each kind with its own
    # rope (global: linear scaling, as Gemma 3 4B+), a window short enough for test prompts to
    # cross it, query_pre_attn_scalar unlike head_dim, and final logit soft-capping.
    "gemma3": {
        "rms_norm_eps": 1e-6,
        "num_hidden_layers": 3,
        "head_dim": 32,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 32,
        "query_pre_attn_scalar": 64,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
        },
    },
    "gemma4": _GEMMA4,
    # Gemma 4 E-series shape (E2B / E4B): the gemma4 layers plus per-layer input embeddings
    # (16 values per layer and token, from their own table and from the embeddings) and the
    # KV-shared layers' double-wide MLP.
    "gemma4_e": {**_GEMMA4, "hidden_size_per_layer_input": 16, "use_double_wide_mlp": True},
    # Gemma 4 mixture-of-experts shape (26B-A4B): the gemma4 layers, each with a routed block of
    # 4 experts (top-2, 64 wide) beside its dense MLP.
    "gemma4_moe": {**_GEMMA4, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
                   "moe_intermediate_size": 64},
    # Gemma 4 with mixed page sizes (as the real checkpoints have): two full-attention KV heads,
    # 128 values per token against the sliding layers' 64, so vLLM doubles the sliding layers'
    # block size to make every page as large.
    "gemma4_pages": {**_GEMMA4, "num_global_key_value_heads": 2},
    # GPT-OSS shape: a sliding layer then a full one (window 32 < TRAIN_SEQ_LEN, so training
    # uses the window), 4 experts routed top-2, YaRN with the real model's betas and no
    # truncation (its ramp falls inside the head), attention sinks and biases, float32.
    "gpt_oss": {
        "rms_norm_eps": 1e-5,
        "head_dim": 32,
        "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 1024,
        },
    },
    # DeepSeek V3 shape: latent attention with q LoRA and interleaved rope, a dense first layer
    # then 8 routed experts in 4 groups (2 groups, top-2) plus a shared expert, YaRN with
    # mscale_all_dim (the softmax-scale correction) unlike mscale (a cos/sin factor too). vLLM
    # routes by topk_method/scoring_func, which transformers' config class does not write.
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "q_lora_rank": 64,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "moe_intermediate_size": 64,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "num_mtp_layers": 0,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
            "original_max_position_embeddings": 1024,
        },
    },
    # Qwen 3.5 text shape: three gated delta-net layers then a full-attention one (the 3.5
    # interval), fewer delta key heads than value heads, a 4-tap convolution, rope on a quarter
    # of each head with the 3.5 checkpoints' interleaved mRoPE split.
    "qwen3_5": {
        "num_hidden_layers": 4,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1], "mrope_interleaved": True,
        },
    },
}

CORRECTION_BIAS_STD = 0.3
"""DeepSeek V3's expert-choice bias is a buffer training leaves at zero; the tiny model gets a
seeded one so that choosing by the biased scores differs from choosing by the plain ones."""


@dataclass(frozen=True)
class TinyRecipe:
    """Everything the written files depend on; equal recipes give byte-equal checkpoints."""

    arch: str
    train_steps: int = 0
    seed: int = 0
    format: int = TINY_FORMAT

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(
                f"arch={self.arch!r} is not supported: expected one of "
                f"{', '.join(ARCHITECTURES)}. Fix: pass --arch with one of those."
            )
        if self.train_steps < 0:
            raise ValueError(
                f"train_steps={self.train_steps} is not supported: expected 0 or more. "
                "Fix: pass --train-steps 0 (no training) or a positive count."
            )


def corpus_text() -> str:
    """The training text shipped with the package."""
    return resources.files("vllm_tt_host").joinpath("corpus.txt").read_text("utf-8")


def build_tokenizer() -> Any:
    """Train the byte-level BPE tokenizer (a ``tokenizers.Tokenizer``) on the shipped corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_paragraphs(corpus_text()), trainer=trainer)
    # Prompts start with bos like Llama's; chat prompts get it from the template instead.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json``: a plain fast tokenizer plus the chat template.

    transformers loads a ``qwen2`` checkpoint with its own Qwen2Tokenizer whatever this file
    says; that class would add an ``<|endoftext|>`` unk token past the model's vocab unless
    ``unk_token`` is explicitly null (byte-level BPE never needs one)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "additional_special_tokens": list(ROLE_TOKENS),
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def build_config(arch: str, vocab_size: int, special_ids: dict[str, int]) -> Any:
    """The transformers config of the tiny ``arch`` model."""
    from transformers import AutoConfig

    model_type = {
        "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text",
        "gemma4": "gemma4_text", "gemma4_e": "gemma4_text", "gemma4_moe": "gemma4_text",
        "gemma4_pages": "gemma4_text", "gpt_oss": "gpt_oss",
        "deepseek_v3": "deepseek_v3", "qwen3_5": "qwen3_5_text",
    }[arch]
    config = AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size,
        **{**_COMMON_DIMS, **_ARCH_CONFIG[arch]},
        **special_ids,
    )
    config.architectures = [ARCHITECTURES[arch]]
    return config


def build_tiny_checkpoint(arch: str, out_dir: str | Path, train_steps: int = 0, seed: int = 0) -> Path:
    """Write the tiny ``arch`` checkpoint into ``out_dir`` and return it.

    Idempotent: a folder whose stamp matches the recipe is returned untouched.
    """
    recipe = TinyRecipe(arch=arch, train_steps=train_steps, seed=seed)
    out = Path(out_dir)
    if _stamp_matches(out, recipe):
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP_FILE).unlink(missing_ok=True)

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils.logging import (
        disable_progress_bar,
        enable_progress_bar,
        is_progress_bar_enabled,
    )

    tokenizer = build_tokenizer()
    special_ids = {
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(EOS),
        "pad_token_id": tokenizer.token_to_id(PAD),
    }
    config = build_config(arch, tokenizer.get_vocab_size(), special_ids)
    with torch.random.fork_rng():  # seed the weights without reseeding the caller's torch
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if train_steps:
            _train(model, _corpus_ids(tokenizer), train_steps, seed)
        _seed_buffers(model)
    model.eval()
    model.generation_config = GenerationConfig(**special_ids)
    bars = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            enable_progress_bar()
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    _write_json(
        out / "special_tokens_map.json",
        {
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "additional_special_tokens": list(ROLE_TOKENS),
        },
    )
    _write_json(out / STAMP_FILE, asdict(recipe))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-tt-tiny-model",
        description="Write a tiny HF checkpoint (tokenizer, config, weights) built locally.",
    )
    parser.add_argument("--arch", required=True, choices=sorted(ARCHITECTURES))
    parser.add_argument("--out", required=True, type=Path, help="folder to write")
    parser.add_argument(
        "--train-steps",
        type=int,
        default=0,
        help="optimizer steps on the shipped corpus (0 = random weights; ~300 reads like text)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        path = build_tiny_checkpoint(args.arch, args.out, args.train_steps, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _corpus_ids(tokenizer: Any) -> Any:
    """The corpus as one token stream: each paragraph is ``bos ... eos``."""
    import torch

    ids: list[int] = []
    for paragraph in _paragraphs(corpus_text()):
        ids.extend(tokenizer.encode(paragraph).ids)
        ids.append(tokenizer.token_to_id(EOS))
    return torch.tensor(ids, dtype=torch.long)


def _train(model: Any, ids: Any, steps: int, seed: int) -> None:
    """A short AdamW run on random corpus windows with a cosine learning-rate decay."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / steps))
    )
    model.train()
    span = len(ids) - TRAIN_SEQ_LEN
    progress = TrainingProgress(steps)
    for step in range(steps):
        starts = torch.randint(0, span, (TRAIN_BATCH,), generator=generator)
        batch = torch.stack([ids[s : s + TRAIN_SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step(step + 1, loss.item)


def _seed_buffers(model: Any) -> None:
    """Give untrained routing buffers (DeepSeek V3's ``e_score_correction_bias``) seeded values."""
    import torch

    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.randn(buffer.shape) * CORRECTION_BIAS_STD)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _stamp_matches(out: Path, recipe: TinyRecipe) -> bool:
    stamp = out / STAMP_FILE
    if not stamp.is_file() or not (out / "model.safetensors").is_file():
        return False
    try:
        return json.loads(stamp.read_text()) == asdict(recipe)
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    raise SystemExit(main())
