"""The experiments, one module (or package) each, all with the same contract, `Experiment`. The CLI, the
report and run folders loop over `registry()`: a new experiment is a new module here, a recipe under
recipes/ and its tests; nothing else changes."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any, Protocol

import pandas as pd

from ..claims import Section
from ..recipes import Recipe
from ..runs import Run


class Experiment(Protocol):
    """What every experiment module exports."""

    COMMAND: str  # `ntk COMMAND`, and its run folders outputs/COMMAND/<recipe name>/
    TITLE: str  # its section's title in the report
    HELP: str  # the command's help: what it runs and what it writes
    RECIPE: type[Recipe]  # its recipe schema; its defaults are the CPU-scale recipe
    NEEDS_RECIPE: bool  # whether the command needs a recipe file (else it runs the defaults)
    FLAGS: dict[str, tuple[str, type, str]]  # recipe field → (flag, int | str | list, help): shortcuts for --set
    RESUMABLE: tuple[str, ...]  # recipe fields that only widen the grid: changing them resumes the run
    FILES: tuple[str, ...]  # what a run writes besides config.yaml and run.json (what --fresh removes)
    SCALE: tuple[str, ...]  # recipe fields that set a run's scale, shown beside its claims
    DEVICES: tuple[str, ...]  # where it runs: ("cpu",) or ("cpu", "cuda")
    POINTS: bool  # whether it hands its grid's points to the run's executor (Run.measure): --workers, --executor

    def plan(self, cfg: Recipe) -> list[tuple[str, str]]:
        """The work a run does, as (what, how much): printed by --dry-run, derived from what `run` executes."""

    def prepare(self, cfg: Recipe) -> Any:
        """Everything the run reads that a bad input can break, loaded before its folder exists."""

    def run(self, cfg: Recipe, folder: Run, prepared: Any) -> dict[str, pd.DataFrame]:
        """Measure what is not measured yet in `folder`; write its CSVs, figures and run.json."""

    def tables(self, cfg: Recipe, result: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
        """(title, table) pairs the command prints at the end."""

    def report(self, runs: list[Run]) -> Section:
        """Its report section from its finished run folders: the papers' claims (paper value, our value,
        verdict by the thresholds the module declares), figures, tables and notes."""


@cache
def registry() -> dict[str, Experiment]:
    """Every experiment of this package (a module that declares COMMAND), by command."""
    found = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    return {module.COMMAND: module for module in sorted(found, key=lambda m: m.__name__) if hasattr(module, "COMMAND")}
