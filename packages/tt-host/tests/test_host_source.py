"""The host model source states each class's capabilities so that ``vllm-tt-models list
--backend host`` answers in well under a second (importing the classes pulls in torch and vLLM,
~40 s here): the statement must match the classes, and the listing must import neither."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

from vllm_tt_host.models import HOST_CAPABILITIES, HOST_MODELS, HOST_SOURCE
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.registry import RegisteredModel

LISTING = """
import contextlib, io, json, sys
from vllm_tt_models_registry.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["list", "--backend", "host", "--json"])
heavy = sorted(m for m in ("torch", "vllm", "transformers", "ttnn", "vllm_tt_platform") if m in sys.modules)
print(json.dumps({"heavy": heavy, "rows": json.loads(out.getvalue())}))
"""


def _class_capabilities(arch: str) -> ModelCapabilities:
    return RegisteredModel(arch, HOST_MODELS[arch], "host").capabilities()  # imports and checks the class


def test_the_table_states_every_class_and_only_those():
    assert set(HOST_CAPABILITIES) == set(HOST_MODELS) == set(HOST_SOURCE)


def test_stated_capabilities_are_what_each_class_declares():
    for arch in HOST_MODELS:
        stated = ModelCapabilities.from_mapping(HOST_CAPABILITIES[arch], owner=arch)
        assert stated == _class_capabilities(arch), f"{arch}: fix the capabilities its family states (vllm_tt_host/models/<family>/__init__.py)"


def test_listing_the_host_backend_imports_no_engine_and_shows_the_classes_capabilities():
    out = subprocess.run([sys.executable, "-c", LISTING], capture_output=True, text=True, check=True, timeout=120)
    seen = json.loads(out.stdout)
    assert seen["heavy"] == []
    host_rows = {row["arch"]: row for row in seen["rows"] if row["source"] == "host"}
    assert set(host_rows) == set(HOST_MODELS)
    for arch, row in host_rows.items():
        expected = json.loads(json.dumps(asdict(_class_capabilities(arch))))  # tuples as JSON lists, nested too
        assert row["error"] is None and row["capabilities"] == expected, arch
