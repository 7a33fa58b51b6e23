"""``vllm-tt-tiny-model`` writes real, loadable, reproducible HF checkpoints."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from vllm_tt_host import tiny
from vllm_tt_host.tiny import STAMP_FILE, build_tiny_checkpoint, main

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def test_cli_writes_a_checkpoint_transformers_loads(tmp_path, tiny_checkpoint, capsys):
    out = tmp_path / "qwen2"
    assert main(["--arch", "qwen2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    for name in FILES:
        assert (out / name).is_file(), name

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert 1000 <= len(tokenizer) <= 2048
    ids = tokenizer("The river moved under the fog.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 0 and len(ids) < 12  # BPE merged real words
    assert tokenizer.decode(ids, skip_special_tokens=True) == "The river moved under the fog."
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<|bos|><|system|>\nBe brief.<|eos|>\n<|user|>\nHi<|eos|>\n<|assistant|>\n"
    )
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") == 5

    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    generated = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, len(ids) + 3)

    # Deterministic: the session fixture built the same recipe elsewhere, byte for byte.
    for name in FILES:
        assert (out / name).read_bytes() == (tiny_checkpoint("qwen2") / name).read_bytes(), name


@pytest.mark.parametrize(
    ("arch", "architecture", "tied"),
    [
        ("llama", "LlamaForCausalLM", True),
        ("mistral", "MistralForCausalLM", False),
        ("qwen2", "Qwen2ForCausalLM", True),
        ("qwen3", "Qwen3ForCausalLM", False),
    ],
)
def test_each_family_has_its_architecture_and_shape(arch, architecture, tied, tiny_checkpoint):
    folder = tiny_checkpoint(arch)
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == [architecture]
    assert config.tie_word_embeddings is tied
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (2, 4, 2)
    assert config.max_position_embeddings == 4096
    assert ("lm_head.weight" in load_file(folder / "model.safetensors")) is not tied
    assert getattr(config, "sliding_window", None) is None
    # transformers picks a family tokenizer class for some model types (Qwen2Tokenizer); it
    # must not add tokens the model has no embedding for.
    assert len(AutoTokenizer.from_pretrained(folder)) == config.vocab_size
    if arch == "llama":
        assert config.rope_parameters["rope_type"] == "llama3"
    if arch == "qwen3":
        assert config.head_dim * config.num_attention_heads != config.hidden_size


def test_build_is_idempotent_and_keyed_by_recipe(tmp_path):
    out = build_tiny_checkpoint("mistral", tmp_path / "m")
    weights = out / "model.safetensors"
    stamp_before = weights.stat().st_mtime_ns
    assert build_tiny_checkpoint("mistral", out) == out
    assert weights.stat().st_mtime_ns == stamp_before  # same recipe: untouched
    untrained = load_file(weights)["model.embed_tokens.weight"]

    build_tiny_checkpoint("mistral", out, train_steps=2, seed=0)
    assert json.loads((out / STAMP_FILE).read_text())["train_steps"] == 2
    assert not torch.equal(load_file(weights)["model.embed_tokens.weight"], untrained)


def test_bad_arguments_are_clear_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--arch", "gpt2", "--out", str(tmp_path)])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--arch", "llama", "--out", str(tmp_path), "--train-steps", "-1"])
    assert "train_steps=-1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="arch='gpt2'"):
        build_tiny_checkpoint("gpt2", tmp_path)


def test_console_script_is_main_and_corpus_ships():
    (script,) = entry_points(group="console_scripts", name="vllm-tt-tiny-model")
    assert script.load() is main
    assert len(tiny.corpus_text()) > 8000
