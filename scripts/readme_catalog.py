#!/usr/bin/env python3
"""README.md's support table is `lossfuse catalog --markdown`, written between its catalog markers.

Usage: scripts/readme_catalog.py LOSSFUSE [--check]
  writes the table into README.md; --check exits 1 (and shows both) when README.md's table differs.
"""
import pathlib
import subprocess
import sys

BEGIN, END = "<!-- catalog:begin -->\n", "<!-- catalog:end -->\n"


def main() -> int:
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--check"):
        print(__doc__, file=sys.stderr)
        return 2
    table = subprocess.run([sys.argv[1], "catalog", "--markdown"], check=True, capture_output=True, text=True).stdout
    readme = pathlib.Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        print(f"{readme}: no {BEGIN.strip()} ... {END.strip()} section", file=sys.stderr)
        return 1
    current = text[start + len(BEGIN):end]
    if len(sys.argv) == 3:
        if current == table:
            return 0
        print(f"README.md's support table differs from `lossfuse catalog --markdown` (run {sys.argv[0]} {sys.argv[1]}):"
              f"\n--- README.md\n{current}--- lossfuse catalog --markdown\n{table}", file=sys.stderr)
        return 1
    readme.write_text(text[:start + len(BEGIN)] + table + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
