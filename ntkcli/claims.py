"""What an experiment says about its paper's claims, as data: a Claim (the paper's statement and value, our
measurement, where it came from, a verdict) and a report Section. Each experiment fills them from its run
folders; the report only renders them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from .errors import first_line

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced", "not run at this scale"
# a comparison with a confidence interval: above 0 is REPRODUCED, below 0 REFUTED, containing 0 INCONCLUSIVE
REFUTED, INCONCLUSIVE = "refuted at this scale", "inconclusive at this scale"
# a comparison on a task where not even full fine-tuning beats the majority class: the split cannot tell methods apart
NO_SIGNAL = "too small to tell at this scale"
# a comparison where one of its two methods does not beat the majority class: not a comparison of methods
NOT_COMPARABLE = "not comparable at this scale"
# a theory claim whose assumed regime (couplings, widths, step, T) the sweep does not meet; the condition follows
OUTSIDE = "outside the theorem's regime at this scale"
# every run behind a claim became NaN or infinite: nothing was measured; the field to lower follows
DIVERGED = "diverged"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, REFUTED, INCONCLUSIVE, NO_SIGNAL, NOT_COMPARABLE, OUTSIDE, DIVERGED, NOT_RUN)


def verdict(ok: bool) -> str:
    return REPRODUCED if ok else NOT_REPRODUCED


@dataclass
class Claim:
    claim: str
    paper: str
    measured: str = "–"
    source: str = "no finished run"
    verdict: str = NOT_RUN


@dataclass
class Section:
    """One experiment's part of the report."""

    command: str
    title: str
    claims: list[Claim] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def skip(self, run, what: str) -> None:
        """Note a run folder that could not be read."""
        self.notes.append(f"`{self.command}/{run.name}` {what}: skipped")

    def readable(self, runs: list, name: str, numeric: tuple[str, ...] = (), columns: tuple[str, ...] = (),
                 figure: str | None = None) -> list[tuple[object, pd.DataFrame]]:
        """(run, its CSV `name`) for the runs where that CSV is readable with the `numeric` and `columns` it
        needs; the others are noted. The readable runs' `figure` is collected."""
        found = []
        for run in runs:
            df = run.csv(name, numeric)
            if df is None or not set(columns) <= set(df.columns):
                self.skip(run, f"has no readable {name}")
                continue
            found.append((run, df))
            if figure and run.path(figure).exists():
                self.figures.append(run.path(figure))
        return found

    @contextlib.contextmanager
    def reading(self, run) -> Iterator[None]:
        """Whatever a malformed run folder breaks while its numbers are read becomes a note; the report goes on."""
        try:
            yield
        except Exception as err:  # noqa: BLE001 — any malformed value in any file
            self.skip(run, f"could not be read ({type(err).__name__}: {first_line(err)})")

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([(c.claim, c.paper, c.measured, c.source, c.verdict) for c in self.claims],
                            columns=["claim", "paper", "measured", "source (run, device, scale)", "verdict"])


def fmt(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else "–"
