"""Write the generated docs pages or, with --check, fail if any is stale.

The pages: the configuration reference (from ``TTConfig`` and the env tables), the model families and the
feature-support matrix (from the model registry, scripts/model_pages.py, the ``vllm serve`` surface
table, ``vllm_tt_platform.config.serve_surface``, and the request-field table, ``request_surface``); in
every other page the
``<!-- generated: NAME -->`` figures (scripts/doc_figures.py, from benchmarks/results). --check also
fails on a machine-local path or a hand-written test figure in README.md or docs/*.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import doc_figures
from model_pages import features_page, models_page
from vllm_tt_host.envs import markdown_table as host_env_table
from vllm_tt_platform.config.options import markdown_reference
from vllm_tt_platform.config.request_surface import markdown_table as request_surface_table
from vllm_tt_platform.config.serve_surface import markdown_table as serve_surface_table


def configuration_page() -> str:
    """The platform's options and variables, then the host backend's variables."""
    return (markdown_reference() + "\nThe host mesh backend (the `vllm-tt-host` distribution) reads these:\n\n"
            + host_env_table())


def feature_page() -> str:
    """The model families' features, then what each of vLLM's own serve options and request fields
    does on TT."""
    return features_page() + "\n" + serve_surface_table() + "\n" + request_surface_table()


DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES: dict[Path, Callable[[], str]] = {
    DOCS / "configuration.md": configuration_page,
    DOCS / "models.md": models_page,
    DOCS / "features.md": feature_page,
}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    renders: dict[Path, Callable[[], str]] = {
        **{path: (lambda path=path: doc_figures.fill(path.read_text())) for path in doc_figures.pages()},
        **PAGES,
    }
    for path, render in renders.items():
        text = render()
        if path.exists() and path.read_text() == text:
            continue
        if check:
            stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    for path in stale:
        print(f"{path} is stale: run python scripts/gen_docs.py", file=sys.stderr)
    problems = doc_figures.problems(doc_figures.pages())
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if stale or problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
