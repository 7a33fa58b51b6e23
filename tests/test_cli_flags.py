"""An option the user gave on the command line is told apart from vLLM's default: asking for
prefix caching on a model without it is an error, while vLLM's default is switched off.

The arguments go through vLLM's own CLI parser (the one ``vllm serve`` builds, with our
``pre_register_and_update``), then through vLLM's config, as in the CLI process."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from vllm_tt_platform.config import cli_flags
from vllm_tt_platform.errors import TTUnsupportedFeatureError

HOST = json.dumps({"tt": {"mesh_backend": "host"}})


@pytest.fixture(autouse=True)
def fresh_record(monkeypatch) -> None:
    """Each test is its own CLI process: nothing recorded by an earlier parse."""
    monkeypatch.setattr(cli_flags, "_given", set())


@pytest.fixture(scope="module")
def llama(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def no_prefix_caching_bundles(tmp_path_factory) -> Path:
    """A bundle serving Llama checkpoints with a model that does not declare prefix caching
    (built once: a bundle's module stays imported under its name)."""
    root = tmp_path_factory.mktemp("bundles")
    bundle = root / "no_prefix_llama"
    bundle.mkdir()
    (bundle / "vllm_metadata.json").write_text(json.dumps({
        "arch": "LlamaForCausalLM", "main_class": "no_prefix_llama:NoPrefixLlama",
        "capabilities": {"supports_prefix_caching": False},
    }))
    (bundle / "no_prefix_llama.py").write_text(textwrap.dedent("""
        from vllm_tt_host.models.families import HostLlamaForCausalLM

        class NoPrefixLlama(HostLlamaForCausalLM):
            pass
    """))
    return root


@pytest.fixture
def no_prefix_caching_bundle(no_prefix_caching_bundles, monkeypatch) -> None:
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(no_prefix_caching_bundles))


def parse(llama: Path, *args: str):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    return parser.parse_args(["--model", str(llama), "--max-model-len", "256", "--additional-config", HOST, *args])


def engine_config(llama: Path, *args: str):
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(parse(llama, *args)).create_engine_config()


@pytest.mark.parametrize(("args", "value"), [
    (["--enable-prefix-caching"], True),
    (["--no-enable-prefix-caching"], False),
    (["--enable-prefix-caching", "--no-enable-prefix-caching"], False),
])
def test_explicit_flag_is_recorded(llama, args, value):
    assert parse(llama, *args).enable_prefix_caching is value
    assert cli_flags.given("enable_prefix_caching")
    assert not cli_flags.given("async_scheduling")


@pytest.mark.parametrize(("yaml", "value"), [("true", True), ("false", False)])
def test_config_file_entry_is_recorded(llama, tmp_path, yaml, value):
    config = tmp_path / "serve.yaml"
    config.write_text(f"enable-prefix-caching: {yaml}\n")
    assert parse(llama, "--config", str(config)).enable_prefix_caching is value
    assert cli_flags.given("enable_prefix_caching")


def test_flag_not_given_is_not_recorded(llama):
    assert parse(llama).enable_prefix_caching is None
    assert not cli_flags.given("enable_prefix_caching")


def test_async_scheduling_is_recorded_and_opt_in(llama):
    assert parse(llama).async_scheduling is False
    assert not cli_flags.given("async_scheduling")
    assert parse(llama, "--async-scheduling").async_scheduling is True
    assert cli_flags.given("async_scheduling")


def test_explicit_prefix_caching_without_capability_is_an_error(llama, no_prefix_caching_bundle):
    with pytest.raises(TTUnsupportedFeatureError) as info:
        engine_config(llama, "--enable-prefix-caching")
    message = str(info.value)
    assert "--enable-prefix-caching" in message
    assert "TTLlamaForCausalLM" in message and "supports_prefix_caching" in message
    assert "Fix:" in message


@pytest.mark.parametrize("args", [[], ["--no-enable-prefix-caching"]], ids=["default", "no-flag"])
def test_default_or_disabled_prefix_caching_without_capability_serves(llama, no_prefix_caching_bundle, args):
    # Not given: vLLM's default (on) is switched off with one info line; --no-...: already off.
    assert engine_config(llama, *args).cache_config.enable_prefix_caching is False


def test_explicit_prefix_caching_with_capability_stays_on(llama):
    assert engine_config(llama, "--enable-prefix-caching").cache_config.enable_prefix_caching is True


def test_offline_prefix_caching_without_capability_is_switched_off(llama, no_prefix_caching_bundle):
    """vllm.LLM(enable_prefix_caching=True) runs no parser and looks like vLLM's default."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(llama), max_model_len=256, additional_config=json.loads(HOST),
                      enable_prefix_caching=True)
    assert args.create_engine_config().cache_config.enable_prefix_caching is False
