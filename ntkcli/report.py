"""outputs/ → report.md and a self-contained report.html: each paper claim beside our measurement.

One section per experiment of the registry, built by the experiment itself (`report(runs)`: its claims,
thresholds and verdicts); this module only finds the finished run folders and renders. A verdict is
"reproduced", "not reproduced", or "not run at this scale". Run folders without a readable run.json are
listed as incomplete; malformed ones become notes; the report never fails on them.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from .claims import NOT_REPRODUCED, REFUTED, REPRODUCED, VERDICTS, Section
from .experiments import Experiment, registry
from .runs import Run


def finished_runs(outputs: Path, exp: Experiment) -> tuple[list[Run], list[str]]:
    """The run folders of `exp` that finished (run.json readable), and a note for each one that did not."""
    runs, notes = [], []
    for folder in sorted(p for p in (outputs / exp.COMMAND).glob("*") if p.is_dir()):
        run = Run.open(folder, exp.SCALE)
        if run.info() is None:
            notes.append(f"incomplete run `{exp.COMMAND}/{folder.name}` (no readable run.json): skipped")
        else:
            runs.append(run)
    return runs, notes


def build(outputs: Path) -> list[Section]:
    sections = []
    for exp in registry().values():
        runs, notes = finished_runs(outputs, exp)
        section = exp.report(runs)
        section.notes = notes + section.notes
        sections.append(section)
    return sections


def claims_table(sections: list[Section]) -> pd.DataFrame:
    return pd.DataFrame([{"command": s.command, "claim": c.claim, "paper": c.paper, "measured": c.measured,
                          "verdict": c.verdict, "run": c.source} for s in sections for c in s.claims])


FINDINGS = ("<!-- findings: made by scripts/findings.py from the run folders in docs/runs; "
            "tests/test_docs.py checks it -->", "<!-- end of findings -->")


def findings(sections: list[Section]) -> str:
    """One line per paper claim (command, claim, measured, verdict, the run that measured it) as a Markdown table between the FINDINGS
    markers: what the README shows, made from the report so that it cannot drift from the runs."""
    table = claims_table(sections)
    table["command"] = "`ntk " + table.command + "`"
    return "\n".join([FINDINGS[0], _md_table(table[["command", "claim", "measured", "verdict", "run"]]), FINDINGS[1]])


BATTERY = ("<!-- battery: made by scripts/findings.py from the run folders in docs/runs; tests/test_docs.py "
           "checks it -->", "<!-- end of battery -->")


def battery(sections: list[Section]) -> str:
    """The paper-2 rules' planted batteries (acceptance rate per class, at each committed run's grid) as a Markdown
    table between the BATTERY markers: what docs/theory-verdicts.md shows beside the rules."""
    tables = [(caption, t) for s in sections for caption, t in s.tables if caption.startswith("each rule's acceptance")]
    body = [f"{caption}:\n\n{_md_table(t)}" for caption, t in tables] or ["(no run folder holds a battery)"]
    return "\n".join([BATTERY[0], *body, BATTERY[1]])


def _counts(sections: list[Section]) -> str:
    counts = claims_table(sections).verdict.str.split(" \\(").str[0].value_counts()
    return "Verdicts: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS) + "."


def _md_table(df: pd.DataFrame) -> str:
    rows = [df.columns, *df.itertuples(index=False)]
    lines = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join([lines[0], "|" + "---|" * len(df.columns), *lines[1:]])


def to_markdown(sections: list[Section], outputs: Path) -> str:
    out = ["# Reproduction report", "", "Each paper claim beside our measurement. " + _counts(sections), ""]
    for s in sections:
        out += [f"## `ntk {s.command}`: {s.title}", "", _md_table(s.frame()), ""]
        for caption, table in s.tables:
            out += [caption, "", _md_table(table), ""]
        out += [f"![{s.command}]({fig.relative_to(outputs)})" for fig in s.figures] + [""]
        out += [f"- {note}" for note in s.notes] + ([""] if s.notes else [])
    return "\n".join(out)


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:4px 8px;
vertical-align:top}th{background:#f3f3f3}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
.reproduced{background:#e3f6e3}.not-reproduced{background:#fbe3e3}.not-run{background:#f1f1f1;color:#666}"""


def _html_table(df: pd.DataFrame, verdicts: bool = False) -> str:
    rows = []
    for r in df.itertuples(index=False):
        v = str(r[-1])
        cls = "reproduced" if v.startswith(REPRODUCED) else "not-reproduced" if v.startswith((NOT_REPRODUCED, REFUTED)) \
            else "not-run"
        attr = f' class="{cls}"' if verdicts else ""
        rows.append(f"<tr{attr}>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>")
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _inline(text: str) -> str:
    """Escaped text with Markdown `code` spans as <code>."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def to_html(sections: list[Section]) -> str:
    contents = "".join(f'<li><a href="#{html.escape(s.command)}"><code>ntk {html.escape(s.command)}</code>: '
                       f"{html.escape(s.title)}</a></li>" for s in sections)
    body = ["<h1>Reproduction report</h1>", f"<p>Each paper claim beside our measurement. {_counts(sections)}</p>",
            f"<h2>Contents</h2><ul>{contents}</ul>"]
    for s in sections:
        body += [f'<h2 id="{html.escape(s.command)}"><code>ntk {html.escape(s.command)}</code>: {html.escape(s.title)}</h2>',
                 _html_table(s.frame(), verdicts=True)]
        for caption, table in s.tables:
            body += [f"<p>{_inline(caption)}</p>", _html_table(table)]
        for fig in s.figures:
            try:
                data = base64.b64encode(fig.read_bytes()).decode()
            except OSError:
                continue
            body.append(f'<img alt="{html.escape(s.command)}" src="data:image/png;base64,{data}">')
        body += [f"<p><em>{_inline(n)}</em></p>" for n in s.notes]
    return f"<!doctype html><html><head><meta charset='utf-8'><title>ntk reproduction report</title>" \
           f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"


def write(outputs: Path) -> tuple[list[Section], Path, Path]:
    """Build every section and write report.md and report.html into `outputs` (atomically)."""
    from .runs import atomic_write, sweep_temp

    sweep_temp(outputs)
    sections = build(outputs)
    md, page = outputs / "report.md", outputs / "report.html"
    atomic_write(md, lambda p: p.write_text(to_markdown(sections, outputs)))
    atomic_write(page, lambda p: p.write_text(to_html(sections)))
    return sections, md, page
