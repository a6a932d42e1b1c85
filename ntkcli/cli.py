"""The `ntk` command line: one command per experiment of the registry, plus `report` and `bench`.

Every experiment command takes an optional RECIPE.yaml (defaults are the CPU-scale recipe), the
experiment's own shortcut flags, and the shared ones (`--seed`, `--device`, `--out`, `--set key=value`,
`--dry-run`, `--fresh`); all of them go through `run_experiment`. Errors a user can cause print one line
and exit with code 2.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import pandas as pd
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .errors import UserError, root_cause
from . import executors
from .experiments import Experiment, registry
from .memory import allocation_failure
from .recipes import Recipe, load_recipe, parse_overrides
from .runs import Run, is_main_process, resolve_device, tune_malloc

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="NTK-Attention and the NTK theory of prefix learning and transformer scaling laws.")
out_console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True)

# the options every experiment command shares, defined once (Typer's Annotated style)
RecipeFile = Annotated[Optional[Path], typer.Argument(help="YAML recipe; omit for the CPU-scale defaults.",
                                                      show_default=False)]
RequiredRecipeFile = Annotated[Path, typer.Argument(help="YAML recipe (e.g. recipes/digits_vit.yaml).",
                                                    show_default=False)]
SHARED = {
    "seed": (Annotated[Optional[int], typer.Option("--seed", help="Base seed of every random draw.")], None),
    "device": (Annotated[Optional[str], typer.Option("--device", help="cpu, cuda or auto.")], None),
    "out": (Annotated[Optional[str], typer.Option("--out", help="Root folder of the run (default outputs/).")], None),
    "workers": (Annotated[Optional[int], typer.Option("--workers", help="Grid points measured at once (local "
                                                                         "worker processes, or Ray tasks).")], None),
    "executor": (Annotated[Optional[str], typer.Option("--executor", help="serial, local or ray (default: serial for "
                                                                          "one worker, local for more).")], None),
    "address": (Annotated[Optional[str], typer.Option("--address", help="A Ray cluster's address (host:port, "
                                                                        "ray://host:port or auto) for --executor "
                                                                        "ray.")], None),
    "sets": (Annotated[list[str], typer.Option("--set", help="Override any recipe field: --set key=value (value "
                                                             "parsed as YAML; repeatable).")], []),
    "dry_run": (Annotated[bool, typer.Option("--dry-run", help="Print the resolved recipe and the planned work; "
                                                               "run nothing.")], False),
    "fresh": (Annotated[bool, typer.Option("--fresh", help="Discard this run folder's earlier results instead "
                                                           "of resuming.")], False),
}


@app.callback()
def _main() -> None:
    """NTK-Attention and the NTK theory of prefix learning and transformer scaling laws.

    Each command runs one experiment from a YAML recipe and writes CSVs, figures and run.json to
    outputs/<command>/<recipe>/.
    """
    tune_malloc()


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError into one red line on stderr and exit code 2."""
    try:
        yield
    except UserError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _progress_factory():
    @contextlib.contextmanager
    def factory(description: str, total: int):
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
        with Progress(*columns, console=err_console, transient=False) as progress:
            task = progress.add_task(description, total=total)
            try:
                yield lambda n=1: progress.advance(task, n)
            except BaseException:
                progress.remove_task(task)  # a failed run ends in its one error line, not under a half-filled bar
                raise
    return factory


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}" if 1e-3 <= abs(value) < 1e5 or value == 0 else f"{value:.3e}"
    return str(value)


def print_table(df: pd.DataFrame, title: str) -> None:
    table = Table(title=escape(title), show_lines=False)
    for col in df.columns:
        table.add_column(str(col), justify="right" if pd.api.types.is_numeric_dtype(df[col]) else "left")
    for row in df.itertuples(index=False):
        table.add_row(*(_fmt(v) for v in row))
    out_console.print(table)


def _dry_run(cfg: Recipe, plan: list[tuple[str, str]]) -> None:
    table = Table(title=f"recipe '{cfg.name}' (resolved)")
    table.add_column("field")
    table.add_column("value")
    for key, value in cfg.model_dump(mode="json").items():
        table.add_row(key, str(value))
    out_console.print(table)
    print_table(pd.DataFrame(plan, columns=["planned", "count"]), "planned work")


def _load(exp: Experiment, recipe: Optional[Path], sets: list[str], flags: dict[str, Any]) -> Recipe:
    """The recipe file (or the defaults) with the flags and --set overrides applied, validated."""
    overrides = {}
    for field, value in flags.items():
        if value is not None:
            overrides[field] = value.split(",") if field in exp.FLAGS and exp.FLAGS[field][1] is list else value
    overrides.update(parse_overrides(sets))
    return load_recipe(exp.RECIPE, recipe, overrides)


def _execute(exp: Experiment, cfg: Recipe, fresh: bool) -> tuple[Run, dict[str, pd.DataFrame]]:
    """Check everything the run needs, then make its folder, run it and write its claims (claims.csv). A run that
    fails before it measured anything leaves no folder behind (one that held earlier results keeps them)."""
    device = resolve_device(cfg.device)
    if device.type not in exp.DEVICES:
        raise UserError(f"{exp.COMMAND} runs on the {' or '.join(exp.DEVICES)} only; use --device cpu")
    if not exp.POINTS and (cfg.workers > 1 or cfg.executor not in ("auto", "serial") or cfg.threads):
        raise UserError(f"{exp.COMMAND} measures its points in one process; --workers, --executor and threads apply to "
                        f"{', '.join(c for c, e in registry().items() if e.POINTS)}")
    folder, runner = None, executors.executor(cfg.executor, cfg.workers, cfg.address, device, cfg.threads)
    try:
        prepared = exp.prepare(cfg)
        main = is_main_process()
        folder = Run.start(exp.COMMAND, cfg, resumable=exp.RESUMABLE, files=exp.FILES, fresh=fresh and main,
                           progress=_progress_factory() if main else None, executor=runner)
        result = exp.run(cfg, folder, prepared)
    except BaseException as err:
        runner.close()
        if folder is not None:
            folder.discard_if_empty(exp.FILES)
        why = allocation_failure(err) or allocation_failure(root_cause(err))
        if why is None:
            raise
        stage = folder.stage if folder is not None else "reading the data and building the model"
        raise UserError(f"out of memory while {stage}: {why}; lower the recipe's sizes") from None
    runner.close()
    if main:
        folder.save_csv("claims.csv", exp.report([Run.open(folder.dir, exp.SCALE)]).frame())
    return folder, result


def run_experiment(exp: Experiment, recipe: Optional[Path], seed: Optional[int], device: Optional[str],
                   out: Optional[str], workers: Optional[int], executor: Optional[str], address: Optional[str],
                   sets: list[str], dry_run: bool, fresh: bool, **flags: Any) -> None:
    """What every experiment command does: load the recipe, plan or run, print the experiment's tables."""
    with user_errors():
        cfg = _load(exp, recipe, sets, {**flags, "seed": seed, "device": device, "out": out, "workers": workers,
                                         "executor": executor, "address": address})
        if dry_run:
            _dry_run(cfg, exp.plan(cfg))
            return
        folder, result = _execute(exp, cfg, fresh)
    if not is_main_process():
        return
    for title, table in exp.tables(cfg, result):
        print_table(table, title)
    for line in result.get("warnings", []):  # what a run measured but must not be read as a result (divergence)
        err_console.print(f"[bold yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
    written = [p.name for p in sorted(folder.dir.iterdir()) if not p.name.startswith(".")]
    err_console.print(f"wrote {folder.dir}/: {', '.join(written)}")


def _signature(exp: Experiment) -> inspect.Signature:
    """The command's parameters: the recipe file, the experiment's flags, the shared options."""
    def param(name: str, annotation, default=inspect.Parameter.empty) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)

    params = [param("recipe", RequiredRecipeFile) if exp.NEEDS_RECIPE else param("recipe", RecipeFile, None)]
    for field, (flag, kind, text) in exp.FLAGS.items():
        params.append(param(field, Annotated[Optional[str if kind is list else kind], typer.Option(flag, help=text)],
                            None))
    params += [param(name, annotation, default) for name, (annotation, default) in SHARED.items()]
    return inspect.Signature(params)


def _add_command(exp: Experiment) -> None:
    def command(**options: Any) -> None:
        run_experiment(exp, **options)

    command.__signature__ = _signature(exp)
    command.__doc__ = exp.HELP
    command.__name__ = exp.COMMAND.replace("-", "_")
    app.command(exp.COMMAND)(command)


for _experiment in registry().values():
    _add_command(_experiment)


@app.command("report")
def report(
    outputs: Annotated[Path, typer.Argument(help="Folder holding the runs (default outputs/).")] = Path("outputs"),
) -> None:
    """Gather every run in OUTPUTS into report.md and a self-contained report.html (figures embedded).

    One section per command; each paper claim (Figure 1's trend, Tables 1–2, Theorems 3.10, 5.5, 7.1, 7.2) beside our measurement, the run it came from, and a verdict: reproduced, not reproduced, refuted or inconclusive, outside the theorem's regime (naming the unmet condition), diverged, or not run at this scale. Malformed or incomplete run folders are listed and skipped.
    """
    from . import report as rep

    with user_errors():
        if not outputs.is_dir():
            raise UserError(f"outputs folder not found: {outputs}")
        try:
            sections, md, page = rep.write(outputs)
        except OSError as err:
            raise UserError(f"cannot write the report into {outputs}: {err.strerror or err}") from None
    table = rep.claims_table(sections)
    print_table(table[["command", "claim", "measured", "verdict"]], "reproduction report: paper claims vs measurements")
    err_console.print(f"wrote {md} and {page}")


@app.command("bench")
def bench(
    suite: Annotated[str, typer.Option("--suite", help="One of the suites below, or all.")] = "all",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    out: Annotated[str, typer.Option("--out", help="Root folder; CSVs go to <out>/bench/.")] = "outputs",
) -> None:
    """Speed and memory of the attention kernels and of each experiment's hot loop, as ratios measured in one run (not part of the tests).

    Suites: attention (forward and forward+backward vs SDPA), prefix (vs exact SDPA over the prefix and the input, m = 2^10 … 2^18), training-memory (peak against L), approx-error (wall time of the CPU default), ntk (closed-form vs autodiff NTK), finetune (training step and its peak memory on MiniLM-L6 per method and ntk variant, ntk and LoRA also compiled), peft (NTK-Attention through get_peft_model beside peft's LoRA and prefix tuning: step time and adapter file), compress (a question attending to an m-token context, exact vs compressed), scaling-law (a packed group of students vs one at a time).
    """
    from .bench import SUITES
    from .runs import atomic_write, sweep_temp

    with user_errors():
        if suite not in (*SUITES, "all"):
            raise UserError(f"unknown --suite {suite!r}; choose one of {', '.join(SUITES)} or all")
        dev = str(resolve_device(device))
        folder = Path(out) / "bench"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            sweep_temp(folder)
        except OSError as err:
            raise UserError(f"cannot write to output folder {folder}: {err.strerror or err}") from None
    for name in SUITES if suite == "all" else (suite,):
        df = SUITES[name].measure(dev)
        atomic_write(folder / SUITES[name].file, lambda p: df.to_csv(p, index=False))
        print_table(df, SUITES[name].title)
    err_console.print(f"wrote {folder}/")
