"""The README's table of findings and docs/theory-verdicts.md's battery table, made from the committed run folders
in docs/runs (what `ntk report docs/runs` reads): prints them, or with --write replaces each between its markers.
Run: .venv/bin/python scripts/findings.py [--write]"""

import sys
from pathlib import Path

from ntkcli.report import BATTERY, FINDINGS, battery, build, findings

ROOT = Path(__file__).resolve().parents[1]


def replace(path: Path, markers: tuple[str, str], block: str) -> None:
    text = path.read_text()
    start, end = text.index(markers[0]), text.index(markers[1]) + len(markers[1])
    path.write_text(text[:start] + block + text[end:])


def main(write: bool) -> None:
    sections = build(ROOT / "docs" / "runs")
    blocks = [(ROOT / "README.md", FINDINGS, findings(sections)),
              (ROOT / "docs" / "theory-verdicts.md", BATTERY, battery(sections))]
    for path, markers, block in blocks:
        if write:
            replace(path, markers, block)
        else:
            print(block)


if __name__ == "__main__":
    main("--write" in sys.argv[1:])
