"""Where every benchmark's results land: a JSON file and a markdown table, side by side."""

from __future__ import annotations

import json
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
