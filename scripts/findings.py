"""The README's table of findings, docs/theory-verdicts.md's battery table and docs/superglue.md's report section,
made from the committed run folders in docs/runs (what `ntk report docs/runs` reads): prints them, or with --write
replaces each between its markers. Run: .venv/bin/python scripts/findings.py [--write]"""

import sys
from pathlib import Path

from ntkcli.report import BATTERY, FINDINGS, battery, build, findings, to_markdown

ROOT = Path(__file__).resolve().parents[1]
SUPERGLUE = ("<!-- superglue run: made by the report from runs/superglue -->", "<!-- end of superglue run -->")


def superglue(sections) -> str:
    """The report's superglue section (its claims, tables, figures and notes) for docs/superglue.md."""
    section = next(s for s in sections if s.command == "superglue")
    body = to_markdown([section], ROOT / "docs").split("\n")[6:]  # without the report's title, counts and heading
    return "\n".join([SUPERGLUE[0], *body, SUPERGLUE[1]])


def replace(path: Path, markers: tuple[str, str], block: str) -> None:
    text = path.read_text()
    start, end = text.index(markers[0]), text.index(markers[1]) + len(markers[1])
    path.write_text(text[:start] + block + text[end:])


def main(write: bool) -> None:
    sections = build(ROOT / "docs" / "runs")
    blocks = [(ROOT / "README.md", FINDINGS, findings(sections)),
              (ROOT / "docs" / "theory-verdicts.md", BATTERY, battery(sections)),
              (ROOT / "docs" / "superglue.md", SUPERGLUE, superglue(sections))]
    for path, markers, block in blocks:
        if write:
            replace(path, markers, block)
        else:
            print(block)


if __name__ == "__main__":
    main("--write" in sys.argv[1:])
