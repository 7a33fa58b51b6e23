"""Test sessions across the supported vLLM releases.

Environments are reused (a vLLM environment is ~9 GB; uv hard-links it from its cache, so a
second run installs nothing), and every session runs on the Python 3.12 that created the tools
environment (scripts/env.sh). docs/support-policy.md says how the window below moves.
"""

from __future__ import annotations

import os
import sys

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests(0.33)"]

if sys.version_info[:2] != (3, 12):
    raise SystemExit(
        f"nox runs on Python {sys.version.split()[0]}, but vllm-tt needs 3.12 (ttnn ships cp310/cp312 "
        "wheels only, vLLM >= 0.32 needs >= 3.11): run `source scripts/env.sh` and use its nox."
    )

VLLM_VERSIONS = ["0.31.0", "0.32.0", "0.33.0"]
"""The support window, newest last; each distribution declares the same range (vllm>=0.31,<0.34)."""
NEWEST = VLLM_VERSIONS[-1]
PRODUCT = ["packages/tt-sampling", "packages/tt-scheduler", "packages/tt-models-registry", "packages/tt-platform"]
"""What a Tenstorrent machine installs; the host backend (tt-host) is for tests, CI and demos."""
PACKAGES = [*PRODUCT, "packages/tt-host"]
SOURCES = [f"{p}/src" for p in PACKAGES]
TEST_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TT_MESH_BACKEND": "host", "VLLM_TARGET_DEVICE": "",
            "PYTHONDONTWRITEBYTECODE": ""}
"""``PYTHONDONTWRITEBYTECODE`` emptied: the test environment is ours, and without bytecode every
engine process compiles vLLM's, torch's and transformers' sources again (about 40 % of a start)."""
WORKERS = ["-n", os.environ.get("TT_TEST_WORKERS", "2"), "--dist", "loadscope"]
"""pytest-xdist: engine start-ups are one process importing while the other core is free, so two
workers nearly halve the suite on two cores; ``vllm_tt_testing.suite_order`` deals the modules
out longest first. ``TT_TEST_WORKERS=0`` runs the suite in one process."""
LINT_TOOLS = ["ruff==0.17.6", "mypy==2.4.1", "types-jsonschema"]


def _install(session: nox.Session, vllm: str, *extra: str, packages: list[str] = PACKAGES) -> None:
    """vLLM ``vllm`` with its pins, the test tools and the distributions (editable; all five
    unless told).

    ``--overrides overrides.txt`` lets numpy 2 win over ttnn's ``numpy<2`` (docs/install.md)."""
    editable = [arg for p in packages for arg in ("-e", p)]
    session.install(
        "--overrides", "overrides.txt", "-r", f"requirements/vllm-{vllm}.txt",
        "-r", "requirements/test.txt", *extra, *editable,
    )


@nox.session
@nox.parametrize("vllm", VLLM_VERSIONS, ids=[v.rsplit(".", 1)[0] for v in VLLM_VERSIONS])
def tests(session: nox.Session, vllm: str) -> None:
    """The whole suite (unit, integration, end to end) against one vLLM release."""
    _install(session, vllm)
    session.run("pytest", *WORKERS, "--suite-times", "build/suite_times", *session.posargs, env=TEST_ENV)


@nox.session
def unit(session: nox.Session) -> None:
    """Fast tests that never start a vLLM engine (newest vLLM)."""
    _install(session, NEWEST)
    session.run("pytest", *WORKERS, "-m", "not e2e", *session.posargs, env=TEST_ENV)


@nox.session
def quick(session: nox.Session) -> None:
    """The inner loop: the tests that start no engine, then one served engine (the README's
    `vllm serve`, tests/e2e/test_serve.py). The whole suite stays what CI runs."""
    _install(session, NEWEST)
    session.run("pytest", *WORKERS, "-m", "not e2e", *session.posargs, env=TEST_ENV)
    session.run("pytest", "tests/e2e/test_serve.py", *session.posargs, env=TEST_ENV)


@nox.session(name="platform-alone")
def platform_alone(session: nox.Session) -> None:
    """The four product distributions without vllm-tt-host, in an environment of their own: the
    platform's tests (ttnn recorder, no emulator), then asking for the host backend must name the
    missing distribution. Not in the default suite."""
    _install(session, NEWEST, packages=PRODUCT)
    env = {k: v for k, v in TEST_ENV.items() if k != "TT_MESH_BACKEND"}
    session.run("pytest", "packages/tt-platform/tests", "-m", "not e2e", *session.posargs, env=env)
    session.run("python", "-c", MISSING_HOST_CHECK, env=env)


MISSING_HOST_CHECK = """
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.errors import TTMeshBackendNotInstalledError
from vllm_tt_platform.mesh.backend import make_backend
try:
    make_backend(TTConfig(mesh_backend="host"))
except TTMeshBackendNotInstalledError as error:
    assert "vllm-tt-host" in str(error) and "TT_MESH_BACKEND" in str(error), error
    print("host backend missing, named:", error)
else:
    raise SystemExit("the host backend was found without vllm-tt-host installed")
"""


@nox.session
def fuzz(session: nox.Session) -> None:
    """The full request fuzz through `vllm serve` (100 generated requests per sampling mode; the
    default run does a short pass of the same test)."""
    _install(session, NEWEST)
    session.run("pytest", "tests/e2e/test_request_fuzz.py", *session.posargs,
                env={**TEST_ENV, "TT_FUZZ_EXAMPLES": "100"})


@nox.session(name="flag-fuzz")
def flag_fuzz(session: nox.Session) -> None:
    """200 seeded combinations of `vllm serve` options vLLM accepts, each built through vLLM's
    validation and the TT startup checks, plus a sample of real starts serving one request;
    results in benchmarks/results/flag_fuzz.* (the suite runs a sample: tests/test_flag_fuzz.py)."""
    _install(session, NEWEST)
    session.run("python", "benchmarks/flag_fuzz.py", *session.posargs, env=TEST_ENV)


@nox.session
def streams(session: nox.Session) -> None:
    """1,000 concurrent streams against one `vllm serve`, a quarter cut by the client; results in
    benchmarks/results/streams.* (arguments go to benchmarks/streams.py, e.g. `-- --streams 2000`)."""
    _install(session, NEWEST)
    session.run("python", "benchmarks/streams.py", *session.posargs, env=TEST_ENV)


@nox.session
def soak(session: nox.Session) -> None:
    """Mixed traffic through one `vllm serve` for a while (`-- --minutes 30`, `-- --mesh-device TG`
    for lanes); results in benchmarks/results/soak*.* (not in CI)."""
    _install(session, NEWEST)
    session.run("python", "benchmarks/soak.py", *session.posargs, env=TEST_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then mypy over every distribution and the benchmarks (settings in pyproject.toml, [tool.mypy])."""
    _install(session, NEWEST, *LINT_TOOLS)
    session.run("ruff", "check", ".")
    session.run("mypy", *SOURCES, "testing", "tests/tombstone.py", "benchmarks", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Fail if a generated page (configuration, model families, feature support) is stale, then
    build the site (mkdocs.yml) strictly: any warning, broken link or anchor fails.

    The generators import the distributions and the host models (torch), hence the full install."""
    _install(session, NEWEST, "-r", "requirements/docs.txt")
    session.run("python", "scripts/gen_docs.py", "--check", env=TEST_ENV)
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks; results land in benchmarks/results/ as JSON and markdown."""
    _install(session, NEWEST)
    for script in ("scheduler_bench.py", "clock_bench.py", "sampling_bench.py", "async_bench.py",
                   "lanes_bench.py", "spec_bench.py", "draft_bench.py", "multi_host_bench.py", "offload_bench.py",
                   "pooling_bench.py", "disagg_bench.py"):
        session.run("python", f"benchmarks/{script}", *session.posargs, env=TEST_ENV)
