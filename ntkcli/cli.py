"""The `ntk` command line: parse, load the recipe, call one experiment, print its tables.

Every command takes an optional RECIPE.yaml (defaults are the CPU-scale recipe), friendly flags for
the common fields, and `--set key=value` for any field. Errors a user can cause print one line and
exit with code 2.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pandas as pd
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.markup import escape
from rich.table import Table

from .errors import UserError
from .recipes import (ApproxErrorRecipe, ConvergenceRecipe, FinetuneRecipe, Recipe, ScalingLawRecipe, load_recipe,
                      method_label, parse_overrides)
from .runs import Run, is_main_process, resolve_device

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="NTK-Attention and the NTK theory of prefix learning and transformer scaling laws.")
out_console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True)


@app.callback()
def _main() -> None:
    """NTK-Attention and the NTK theory of prefix learning and transformer scaling laws.

    Each command runs one experiment from a YAML recipe and writes CSVs, figures and run.json to
    outputs/<command>/<recipe>/.
    """

RecipeArg = typer.Argument(None, help="YAML recipe; omit for the CPU-scale defaults.", show_default=False)
SetOpt = typer.Option([], "--set", help="Override any recipe field: --set key=value (value parsed as YAML; repeatable).")
SeedOpt = typer.Option(None, "--seed", help="Base seed of every random draw.")
DeviceOpt = typer.Option(None, "--device", help="cpu, cuda or auto.")
OutOpt = typer.Option(None, "--out", help="Root folder of the run (default outputs/).")
DryRunOpt = typer.Option(False, "--dry-run", help="Print the resolved recipe and the planned work; run nothing.")
FreshOpt = typer.Option(False, "--fresh", help="Discard this run folder's earlier results instead of resuming.")


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError into one red line on stderr and exit code 2."""
    try:
        yield
    except UserError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
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


def _load(cls: type[Recipe], recipe: Optional[Path], sets: list[str], **flags: Any) -> Recipe:
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(parse_overrides(sets))
    return load_recipe(cls, recipe, overrides)


def _start_run(command: str, cfg: Recipe, experiment, fresh: bool) -> Run:
    """The run folder, once everything the run needs has been checked; under torchrun only rank 0 discards
    old results and shows progress."""
    main = is_main_process()
    return Run(command, cfg, resumable=experiment.RESUMABLE, files=experiment.FILES, fresh=fresh and main,
               progress=_progress_factory() if main else None)


def _dry_run(cfg: Recipe, plan: list[tuple[str, str]]) -> None:
    table = Table(title=f"recipe '{cfg.name}' (resolved)")
    table.add_column("field")
    table.add_column("value")
    for key, value in cfg.model_dump(mode="json").items():
        table.add_row(key, str(value))
    out_console.print(table)
    print_table(pd.DataFrame(plan, columns=["planned", "count"]), "planned work")


@app.command("approx-error")
def approx_error(
    recipe: Optional[Path] = RecipeArg,
    max_log2m: Optional[int] = typer.Option(None, "--max-log2m", help="Largest prefix length is 2^max_log2m (1–30)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Independent draws of W and P per regime."),
    protocol: Optional[str] = typer.Option(None, "--protocol", help="text (paper §4.4) or released (authors' script; m ≤ 2^12)."),
    seed: Optional[int] = SeedOpt,
    device: Optional[str] = DeviceOpt,
    out: Optional[str] = OutOpt,
    sets: list[str] = SetOpt,
    dry_run: bool = DryRunOpt,
    fresh: bool = FreshOpt,
) -> None:
    """Figure 1 (§4.4): error of NTK-Attention against exact attention with an m-long prefix.

    For m = 2, 4, …, 2^max_log2m and m = ∞, and for each method (compress-taylor2, compress-favor,
    compress-elu, fit-lstsq, fit-adam, infinite-limit), writes results.csv (one row per regime,
    repeat, m, method), summary.csv (mean ± std), approx_error.png and run.json to
    outputs/approx-error/<recipe>/. Re-running resumes and skips finished points.
    """
    from .experiments import approx_error as experiment

    with user_errors():
        cfg = _load(ApproxErrorRecipe, recipe, sets, max_log2m=max_log2m, repeats=repeats, protocol=protocol,
                    seed=seed, device=device, out=out)
        if dry_run:
            ms = cfg.max_log2m + (cfg.include_infinity and cfg.protocol == "text")
            _dry_run(cfg, [("regimes (weight_std)", str(len(cfg.weight_std))), ("repeats", str(cfg.repeats)),
                           ("prefix lengths m", f"{ms} (2^1 … 2^{cfg.max_log2m}{', ∞' if ms > cfg.max_log2m else ''})"),
                           ("methods", str(len(cfg.methods))),
                           ("queries streamed per repeat", str((cfg.n_train + cfg.n_test) * cfg.seq_len))])
            return
        resolve_device(cfg.device)
        run = _start_run("approx-error", cfg, experiment, fresh)
        tables = experiment.run(cfg, run)
    print_table(tables["headline"], f"approx-error: Eq. (6) error, mean over {cfg.repeats} repeats (s = {cfg.scale:.4g})")
    err_console.print(f"wrote {run.dir}/results.csv, summary.csv, approx_error.png, run.json")


@app.command("convergence")
def convergence(
    recipe: Optional[Path] = RecipeArg,
    parts: Optional[str] = typer.Option(None, "--parts", help="Comma-separated: prefix, transformer, stand-in."),
    seed: Optional[int] = SeedOpt,
    device: Optional[str] = DeviceOpt,
    out: Optional[str] = OutOpt,
    sets: list[str] = SetOpt,
    dry_run: bool = DryRunOpt,
    fresh: bool = FreshOpt,
) -> None:
    """NTK convergence of both papers: prefix learning (Thm 3.10) and the N-layer transformer (Thm 5.5).

    Trains paper 1's one-token prefix model by gradient descent for m = 2^4 … 2^14, the NTK-Attention
    stand-in (Z, k) beside it, and paper 2's transformer by SGD over depths and widths; closed-form
    kernels are checked against autodiff. Writes results.csv, curves.csv, summary.csv (log-log fits),
    convergence.png and run.json to outputs/convergence/<recipe>/; re-running resumes.
    """
    from .experiments import convergence as experiment

    with user_errors():
        cfg = _load(ConvergenceRecipe, recipe, sets, seed=seed, device=device, out=out,
                    parts=parts.split(",") if parts else None)
        if dry_run:
            _dry_run(cfg, [("prefix runs (m values × seeds)", str(len(cfg.log2m) * cfg.seeds * ("prefix" in cfg.parts))),
                           ("stand-in runs", str(cfg.seeds * ("stand-in" in cfg.parts))),
                           ("transformer runs (depths × widths × seeds)",
                            str(len(cfg.t_depths) * len(cfg.t_widths) * cfg.seeds * ("transformer" in cfg.parts)))])
            return
        if resolve_device(cfg.device).type != "cpu":
            raise UserError("convergence runs its float64 theory checks on the CPU only; use --device cpu")
        run = _start_run("convergence", cfg, experiment, fresh)
        tables = experiment.run(cfg, run)
    print_table(tables["prefix"], "paper 1: one-token prefix (rates per step; λ of H = JJᵀ/m)")
    print_table(tables["transformer"], "paper 2: N-layer transformer, SGD")
    print_table(tables["fits"], "log-log fits")
    err_console.print(f"wrote {run.dir}/results.csv, curves.csv, summary.csv, convergence.png, run.json")


@app.command("finetune")
def finetune(
    recipe: Path = typer.Argument(..., help="YAML recipe (e.g. recipes/digits_vit.yaml).", show_default=False),
    seed: Optional[int] = SeedOpt,
    device: Optional[str] = DeviceOpt,
    out: Optional[str] = OutOpt,
    sets: list[str] = SetOpt,
    dry_run: bool = DryRunOpt,
    fresh: bool = FreshOpt,
) -> None:
    """Tables 1–2 (§5): NTK-Attention vs P-Tuning v2 vs LoRA vs full fine-tuning, several seeds.

    Loads the recipe's Hugging Face model and data (hub, local files, or the offline digits), injects
    each method, trains with the Trainer and evaluates accuracy after every epoch. Writes results.csv
    (method, seed, epoch), summary.csv (accuracy mean ± std, trainable parameters, time, memory) and
    run.json to outputs/finetune/<recipe>/; re-running skips finished (method, seed) pairs.
    Runs unchanged under torchrun and accelerate launch.
    """
    from .experiments import finetune as experiment

    with user_errors():
        cfg = _load(FinetuneRecipe, recipe, sets, seed=seed, device=device, out=out)
        if dry_run:
            _dry_run(cfg, [("methods", ", ".join(method_label(m) for m in cfg.methods)),
                           ("seeds", str(len(cfg.seeds))), ("training runs", str(len(cfg.methods) * len(cfg.seeds))),
                           ("epochs per run", str(cfg.train.epochs)),
                           ("model", cfg.model.name_or_path or f"from config ({cfg.model.config.get('model_type')})"),
                           ("data", cfg.data.path or f"{cfg.data.name} {cfg.data.config or ''}".strip())])
            return
        inputs = experiment.prepare(cfg)
        run = _start_run("finetune", cfg, experiment, fresh)
        tables = experiment.run(cfg, run, inputs)
    if not is_main_process():
        return
    s = tables["summary"]
    shown = pd.DataFrame({
        "method": s.method,
        "accuracy % (mean ± std)": [f"{100 * m:.2f} ± {100 * d:.2f}" for m, d in zip(s.accuracy_mean, s.accuracy_std)],
        "best epoch %": 100 * s.best_epoch_accuracy_mean, "seeds": s.seeds,
        "trainable params": s.trainable_params, "trainable %": s.trainable_pct,
        "train s": s.train_seconds, "peak MiB": s.peak_mem_mb})
    print_table(shown, f"finetune '{cfg.name}': final-epoch accuracy on {cfg.data.eval_split}")
    err_console.print(f"wrote {run.dir}/results.csv, summary.csv, run.json")


@app.command("scaling-law")
def scaling_law(
    recipe: Optional[Path] = RecipeArg,
    sweeps: Optional[str] = typer.Option(None, "--sweeps", help="Comma-separated: time, data, model, compute."),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Students per sweep point."),
    seed: Optional[int] = SeedOpt,
    device: Optional[str] = DeviceOpt,
    out: Optional[str] = OutOpt,
    sets: list[str] = SetOpt,
    dry_run: bool = DryRunOpt,
    fresh: bool = FreshOpt,
) -> None:
    """Paper 2, Theorems 7.1–7.2: scaling laws of a transformer trained by SGD on teacher–student data.

    Trains paper 2's model for every (data size N, width m, depth) the sweeps need, several seeds,
    vectorised over N and seeds; fits the time, data and model laws (power laws with offset, Huber
    loss in log space, bootstrap 95% intervals) and the two-stage compute frontier with its
    breakpoint C*(N). Writes results.csv, frontier.csv, fits.csv, summary.csv (verdicts),
    scaling_law.png and run.json to outputs/scaling-law/<recipe>/; re-running resumes point by point.
    Under torchrun the sweep points are sharded across processes.
    """
    from .experiments import scaling_law as experiment

    with user_errors():
        cfg = _load(ScalingLawRecipe, recipe, sets, seed=seed, device=device, out=out, seeds=seeds,
                    sweeps=sweeps.split(",") if sweeps else None)
        points = experiment.sweep_points(cfg)
        if dry_run:
            _dry_run(cfg, [("sweep points (N, m, depth)", str(len(points))), ("students", str(len(points) * cfg.seeds)),
                           ("vectorised groups (m, depth)", str(len({(w, d) for _, w, d in points}))),
                           ("SGD steps per student", str(cfg.steps))])
            return
        if resolve_device(cfg.device).type != "cpu":
            raise UserError("scaling-law trains its small students on the CPU only; use --device cpu")
        run = _start_run("scaling-law", cfg, experiment, fresh)
        tables = experiment.run(cfg, run)
    if not is_main_process():
        return
    print_table(tables["verdicts"][["law", "theorem", "theory", "measured", "verdict"]],
                "paper 2 scaling laws: theory vs measurement (95% bootstrap intervals)")
    err_console.print(f"wrote {run.dir}/results.csv, frontier.csv, fits.csv, summary.csv, scaling_law.png, run.json")


@app.command("report")
def report(
    outputs: Path = typer.Argument(Path("outputs"), help="Folder holding the runs (default outputs/)."),
) -> None:
    """Gather every run in OUTPUTS into report.md and a self-contained report.html (figures embedded).

    One section per command; each paper claim (Figure 1's trend, Tables 1–2, Theorems 3.10, 5.5, 7.1,
    7.2) beside our measurement, the run it came from, and a verdict: reproduced, not reproduced, or
    not run at this scale. Incomplete run folders are listed and skipped.
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
    suite: str = typer.Option("all", "--suite", help="attention (forward vs SDPA), prefix (vs exact SDPA over "
                              "[prefix; input], m = 2^10 … 2^18), approx-error (wall time of the CPU default), "
                              "ntk (closed-form vs autodiff NTK at n·d = 512), finetune (training step on "
                              "MiniLM-L6 per method, batch 32 × 128 tokens), scaling-law (sweep points per minute, "
                              "vectorised vs one at a time), or all."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    out: str = typer.Option("outputs", "--out", help="Root folder; CSVs go to <out>/bench/."),
) -> None:
    """Speed and memory of the attention kernels, as ratios measured in one run (not part of the tests)."""
    from . import bench as b
    from .runs import atomic_write, sweep_temp

    suites = ("attention", "prefix", "approx-error", "ntk", "finetune", "scaling-law")
    with user_errors():
        if suite not in suites + ("all",):
            raise UserError(f"unknown --suite {suite!r}; choose one of {', '.join(suites)} or all")
        dev = str(resolve_device(device))
        folder = Path(out) / "bench"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            sweep_temp(folder)
        except OSError as err:
            raise UserError(f"cannot write to output folder {folder}: {err.strerror or err}") from None
    chosen = suites if suite == "all" else (suite,)

    def save(name: str, df: pd.DataFrame, title: str) -> None:
        atomic_write(folder / name, lambda p: df.to_csv(p, index=False))
        print_table(df, title)

    if "attention" in chosen:
        save("attention.csv", b.forward_vs_sdpa([(8, 12, 128, 64), (1, 12, 4096, 64)], dev),
             "forward: ntk_attention vs SDPA without prefix")
    if "prefix" in chosen:
        save("prefix.csv", b.prefix_scaling(list(range(10, 19)), device=dev),
             "ntk_attention vs exact SDPA over [prefix; input] (B=1, H=12, L=128, d=64; "
             "peak MiB: rise of max RSS on CPU, max allocated on CUDA)")
    if "approx-error" in chosen:
        total, per_m = b.approx_error_wall_time()
        save("approx_error_time.csv", per_m.assign(total_seconds=total),
             f"approx-error CPU default at --max-log2m 18: {total:.1f} s in all; seconds per m (stream + methods)")
    if "ntk" in chosen:
        save("ntk.csv", b.ntk_closed_vs_autodiff(), "paper 1's full NTK: closed form vs torch.func (float64)")
    if "finetune" in chosen:
        save("finetune.csv", b.finetune_step(dev), "training step (AdamW) on MiniLM-L6, batch 32 × 128 tokens")
    if "scaling-law" in chosen:
        save("scaling_law.csv", b.scaling_law_points(), "scaling-law students: vectorised (vmap) vs one at a time")
    err_console.print(f"wrote {folder}/")
