"""The ``vllm serve`` surface table (``config.serve_surface``) against the installed vLLM's own
parser: a destination a new vLLM release adds fails here, by name, until it is classified; each
"works" names a test that exists and each "refused" a check that exists."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest
from vllm_tt_platform.config.serve_surface import SURFACE, problems
from vllm_tt_platform.config.surface import Entry, Support, resolve

ROOT = Path(__file__).resolve().parent.parent


def serve_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s parser as vLLM builds it (the module moved in 0.33)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.31, 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


def test_every_serve_destination_of_the_installed_vllm_has_one_class():
    assert problems(serve_parser()) == []


def test_a_destination_the_table_does_not_know_fails_by_name():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--max-num-seqs")
    parser.add_argument("--tt-planted-knob")
    parser.add_argument("positional")
    assert problems(parser) == ["tt_planted_knob: unclassified"]


def test_a_destination_two_prefix_rules_match_is_ambiguous():
    surface = (Entry(Support.GAP, "one", prefix="tt_"), Entry(Support.GAP, "two", prefix="tt_planted"))
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tt-planted-knob")
    assert problems(parser, surface) == ["tt_planted_knob: matched by 2 entries"]
    assert resolve("tt_other", surface).entry is surface[0]


def defines_test(root: Path, proof: str) -> bool:
    """Whether the pytest node id ``path::test`` names a test function that exists."""
    path, _, name = proof.partition("::")
    source = root / path
    return source.is_file() and bool(
        re.search(rf"^(async )?def {re.escape(name)}\(", source.read_text(), re.MULTILINE))


def defines_check(proof: str) -> bool:
    """Whether ``module:function`` names a function that exists."""
    module, _, function = proof.partition(":")
    return callable(getattr(importlib.import_module(module), function, None))


@pytest.mark.parametrize("entry", [e for e in SURFACE if e.support is Support.WORKS], ids=lambda e: e.proof)
def test_every_works_entry_names_a_test_that_exists(entry):
    assert defines_test(ROOT, entry.proof), entry.proof


@pytest.mark.parametrize("entry", [e for e in SURFACE if e.support is Support.REFUSED], ids=lambda e: e.proof)
def test_every_refused_entry_names_a_check_that_exists(entry):
    assert defines_check(entry.proof), entry.proof


def test_every_entry_names_destinations_or_a_prefix_and_says_why():
    for entry in SURFACE:
        assert bool(entry.dests) != bool(entry.prefix), entry
        assert entry.proof, entry
