"""The README's table of findings, made from the committed run folders in docs/runs (what `ntk report docs/runs`
reads): prints it, or with --write replaces the table between its markers in README.md.
Run: .venv/bin/python scripts/findings.py [--write]"""

import sys
from pathlib import Path

from ntkcli.report import FINDINGS, build, findings

ROOT = Path(__file__).resolve().parents[1]


def main(write: bool) -> None:
    table = findings(build(ROOT / "docs" / "runs"))
    if not write:
        print(table)
        return
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(FINDINGS[0]), readme.index(FINDINGS[1]) + len(FINDINGS[1])
    (ROOT / "README.md").write_text(readme[:start] + table + readme[end:])


if __name__ == "__main__":
    main("--write" in sys.argv[1:])
