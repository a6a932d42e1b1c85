"""The README and docs/ name only what exists (commands, recipes, make targets, files), and the README's findings
are what the committed run folders in docs/runs say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ntkcli.experiments import registry
from ntkcli.report import battery, build, findings

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = {*registry(), "report", "bench"}
TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
# method labels that read like commands (`ntk paper`): what the recipes name their entries
LABELS = {m for p in (ROOT / "recipes").rglob("*.yaml") for m in re.findall(r"label: ([\w -]+?)[,}\n]", p.read_text())}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_recipe_target_and_link_named_exists(page):
    """`ntk <command>` and `make <target>` in code spans and code lines, recipes/… paths, relative links."""
    text = page.read_text()
    fenced = [ln for block in re.findall(r"```\w*\n(.*?)```", text, re.S) for ln in block.splitlines()]
    code = [c for c in re.findall(r"`([^`\n]+)`", text) if c not in LABELS] + fenced
    commands = {m for c in code for m in re.findall(r"^(?:.*\$\(which ntk\) |)ntk ([a-z][a-z-]*)", c)}
    assert commands <= COMMANDS, commands - COMMANDS
    recipes = set(re.findall(r"recipes/[\w/.-]+\.yaml", text))
    assert all((ROOT / r).is_file() for r in recipes), [r for r in recipes if not (ROOT / r).is_file()]
    targets = {m for c in code for m in re.findall(r"^make ([a-z][a-z-]*)", c)}
    assert targets <= TARGETS, targets - TARGETS
    links = [link for link in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in link]
    missing = [link for link in links if not (page.parent / link).exists()]
    assert not missing, missing


def test_the_readme_findings_are_the_reports_of_the_committed_runs():
    readme = (ROOT / "README.md").read_text()
    assert findings(build(ROOT / "docs" / "runs")) in readme, "run scripts/findings.py --write"


def test_the_rules_battery_table_is_the_committed_runs():
    page = (ROOT / "docs" / "theory-verdicts.md").read_text()
    assert battery(build(ROOT / "docs" / "runs")) in page, "run scripts/findings.py --write"


def test_the_superglue_page_shows_the_committed_runs_report():
    import importlib.util
    spec = importlib.util.spec_from_file_location("findings", ROOT / "scripts" / "findings.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (ROOT / "docs" / "superglue.md").read_text()
    assert script.superglue(build(ROOT / "docs" / "runs")) in page, "run scripts/findings.py --write"


def test_the_readme_fits_on_two_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
