"""Where every benchmark's results land: a JSON file and a markdown table, side by side."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_results(result: dict[str, Any], json_path: Path, markdown_path: Path, table: str) -> None:
    """Write ``result`` as JSON and ``table`` as markdown, and print the table."""
    for path in (json_path, markdown_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    markdown_path.write_text(table)
    print(table)
    print(f"wrote {json_path} and {markdown_path}")


def recorded(result: dict[str, Any], benchmark: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``result`` with what ``benchmark()`` returns, the vLLM version, the machine and the seconds it took."""
    import platform
    import sys
    import time

    import vllm

    started = time.perf_counter()
    result.update(benchmark())
    result["vllm"] = vllm.__version__
    result["machine"] = {"python": sys.version.split()[0], "platform": platform.platform()}
    result["seconds"] = time.perf_counter() - started
    return result


def targets_lines(targets: dict[str, bool]) -> list[str]:
    """A benchmark table's closing line: each target and whether it was met."""
    return ["", "Targets: " + ", ".join(f"{n}: {'yes' if ok else 'NO'}" for n, ok in targets.items())]


def bench_main(doc: str, name: str, quick_help: str, run: Callable[[bool], dict[str, Any]],
               markdown: Callable[[dict[str, Any]], str], results: Path) -> None:
    """A speculation benchmark's command line: ``[--quick] [--out DIR]``, then ``run(quick)``
    with the command and host recorded, written as ``DIR/{name}.json`` and ``.md``."""
    import argparse
    import os
    import platform

    import torch

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, default=results)
    args = parser.parse_args()
    result = {
        "command": f"python benchmarks/{name}.py" + (" --quick" if args.quick else ""),
        "host": f"{platform.machine()} torch {torch.__version__}, {os.cpu_count()} cores",
        **run(args.quick),
    }
    write_results(result, args.out / f"{name}.json", args.out / f"{name}.md", markdown(result))
