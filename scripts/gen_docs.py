"""Write the generated docs pages (configuration reference) or, with --check, fail if stale."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_tt_platform.config.options import markdown_reference

PAGES = {Path(__file__).resolve().parent.parent / "docs" / "configuration.md": markdown_reference}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, render in PAGES.items():
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
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
