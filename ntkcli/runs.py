"""Run folders: resolved config, atomic CSV/PNG writes, resume, run.json, seeding, device choice and the
process's allocator setting."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import operator
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd
import torch
import yaml

from . import __version__
from .errors import UserError, first_line
from .executors import PointFn, Serial
from .recipes import Recipe


def resolve_device(name: str) -> torch.device:
    """cpu, cuda[:N] (an error if absent) or auto."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise UserError(f"unknown device {name!r}; use cpu, cuda, cuda:N or auto")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name} was asked for, but no CUDA device is available (use --device cpu)")
    if index and int(index) >= torch.cuda.device_count():
        raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


_UMASK = os.umask(0)
os.umask(_UMASK)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def tune_malloc(mmap_from: int = 32 << 20, trim_from: int = 1 << 30) -> bool:
    """Fix glibc malloc's thresholds: blocks of mmap_from bytes or more get their own mapping (returned to the
    system when freed), and free heap beyond trim_from is given back. The defaults, which the `ntk` command
    sets, keep freed memory for reuse, so that a tensor allocated anew every step reuses warm pages instead of
    faulting new ones in (PyTorch's CPU tuning guide suggests jemalloc or tcmalloc for the same reason); small
    thresholds make the max RSS follow the live tensors, for memory measurements. Where libc has no mallopt
    it does nothing and returns False."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_from)) and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_from))
    except (OSError, AttributeError):
        return False


def process_rank() -> tuple[int, int]:
    """(rank, world size) under torchrun / accelerate launch; (0, 1) in a plain process."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Rank 0, the one process that writes outputs and prints."""
    return process_rank()[0] == 0


TEMP_PREFIX = ".ntk-tmp-"  # temporary files of atomic_write; a killed write leaves one, swept by sweep_temp


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp) on a temporary file beside `path`, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def sweep_temp(folder: Path) -> None:
    """Remove the temporary files that a killed write left in `folder`."""
    for tmp in folder.glob(f"{TEMP_PREFIX}*"):
        tmp.unlink(missing_ok=True)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


Advance = Callable[[float], None]


def _flat(config: dict, prefix: str = "") -> dict:
    """A recipe's fields by dotted name, sections opened: {"data": {"tasks": [..]}} → {"data.tasks": [..]}."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


RUNNER = ("device", "out", "executor", "workers", "address", "threads")  # where and by whom a run is measured, not what


class Run:
    """One experiment's folder outputs/<command>/<name>/: `Run.start` makes it for a run, which writes its
    CSVs, figures and run.json there point by point; `Run.open` reads a finished one (the report)."""

    def __init__(self, folder: Path, recipe: Recipe | None = None, *, scale: tuple[str, ...] = (),
                 progress: Callable[[str, int], contextlib.AbstractContextManager[Advance]] | None = None,
                 executor=None):
        self.dir, self.recipe, self.scale, self.progress_factory = Path(folder), recipe, scale, progress
        self.executor = executor or Serial()  # who measures the points handed to `measure`
        self.started = time.time()
        self.stage = "starting the run"  # what the run is doing: the last task's description
        self.made = not self.dir.exists()  # whether this run made its folder

    @classmethod
    def start(cls, command: str, recipe: Recipe, *, resumable: tuple[str, ...] = (), files: tuple[str, ...] = (),
              fresh: bool = False, progress=None, executor=None) -> "Run":
        """The run folder of `recipe`, resumable point by point. `resumable` lists the recipe fields that only
        widen the grid (more m, more repeats): a re-run that changes only those resumes; a change to any other
        field needs --fresh or another --out. `files` names what the experiment writes there (besides
        config.yaml and run.json): the files that count as results and the only ones --fresh removes."""
        run = cls(Path(recipe.out) / command / (recipe.name or "default"), recipe, progress=progress,
                  executor=executor)
        try:
            run.dir.mkdir(parents=True, exist_ok=True)
            probe = run.dir / f"{TEMP_PREFIX}write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise UserError(f"cannot write to output folder {run.dir}: {err.strerror or err}") from None
        sweep_temp(run.dir)
        outputs = [p for pattern in files for p in run.dir.glob(pattern)]
        if fresh:
            for old in outputs + [run.dir / "config.yaml", run.dir / "run.json"]:
                shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
        elif outputs:
            run._check_same_recipe(recipe.model_dump(mode="json"), resumable)
        run.write_text("config.yaml", yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
        return run

    @classmethod
    def open(cls, folder: Path, scale: tuple[str, ...] = ()) -> "Run":
        """A run folder to read; `scale` names the recipe fields that set its scale (shown by `source`)."""
        return cls(folder, scale=scale)

    def _check_same_recipe(self, config: dict, resumable: tuple[str, ...]) -> None:
        """Refuse to mix results of two recipes: only `resumable` fields (and device, out) may differ; a dotted
        name ("data.tasks") frees one field of a section."""
        old = self.config()
        if old is None:
            raise UserError(f"{self.dir} holds results but no readable config.yaml; pass --fresh to discard them "
                            "or --out to write elsewhere")
        old, config, free = _flat(old), _flat(config), (*resumable, *RUNNER)
        changed = sorted(k for k in set(old) | set(config)
                         if not any(k == f or k.startswith(f + ".") for f in free) and old.get(k) != config.get(k))
        if changed:
            raise UserError(f"{self.dir} holds results of a different recipe (fields {', '.join(changed)} differ); "
                            "pass --fresh to discard them or --out to write elsewhere")

    # --- reading ---------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.dir.name

    def path(self, name: str) -> Path:
        return self.dir / name

    def config(self) -> dict | None:
        """config.yaml as a mapping, or None when it is missing or unreadable."""
        try:
            config = yaml.safe_load(self.path("config.yaml").read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None
        return config if isinstance(config, dict) else None

    def info(self) -> dict | None:
        """run.json (written when a run finishes) as a mapping, or None."""
        try:
            info = json.loads(self.path("run.json").read_text())
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        return info if isinstance(info, dict) else None

    def csv(self, name: str, numeric: tuple[str, ...] = ()) -> pd.DataFrame | None:
        """A CSV to report on, or None when it is unreadable, lacks a `numeric` column or holds text in one."""
        try:
            df = pd.read_csv(self.path(name))
        except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError):
            return None
        if not all(c in df and pd.api.types.is_numeric_dtype(df[c]) for c in numeric):
            return None
        return df

    def load_csv(self, name: str) -> pd.DataFrame | None:
        """A CSV this run resumes from: None when absent, an error when unreadable (nothing is overwritten)."""
        path = self.path(name)
        if not path.exists():
            return None
        try:
            return pd.read_csv(path)
        except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError) as err:
            raise UserError(f"cannot resume from {path}: {first_line(err)}; pass --fresh to discard it") from None

    @property
    def source(self) -> str:
        """The run folder (named after its recipe), its device and the recipe fields that set its scale."""
        config = self.config() or {}
        scale = ", ".join(f"{k} {_short(config[k])}" for k in self.scale if k in config)
        device = (self.info() or {}).get("device", "?")
        return f"{self.dir.parent.name}/{self.name} ({device}{'; ' + scale if scale else ''})"

    # --- writing ---------------------------------------------------------------------------------------

    def write_text(self, name: str, text: str) -> None:
        atomic_write(self.path(name), lambda p: p.write_text(text))

    def save_csv(self, name: str, df: pd.DataFrame) -> None:
        atomic_write(self.path(name), lambda p: df.to_csv(p, index=False))

    def save_figure(self, name: str, fig) -> None:
        """Write a matplotlib figure as PNG, then close it."""
        from .figures import pyplot

        atomic_write(self.path(name), lambda p: fig.savefig(p, dpi=130, bbox_inches="tight", format="png"))
        pyplot().close(fig)

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Advance]:
        """A progress bar (when the CLI gave one) for `total` units of work."""
        self.stage = description
        if self.progress_factory is None:
            yield lambda n=1: None
        else:
            with self.progress_factory(description, total) as advance:
                yield advance

    def measure(self, description: str, fn: PointFn, points: list, shared, cost: Callable[[object], float]):
        """(point, fn(shared, point, advance) or Failed) for every point, as they finish, measured by the run's
        executor; one progress bar of sum(cost(point)) units."""
        with self.task(description, sum(cost(p) for p in points)) as advance:
            yield from self.executor.map(fn, points, shared, advance, cost)

    def discard_if_empty(self, files: tuple[str, ...]) -> None:
        """After a failed run: when none of `files` (its results) exists, remove what the run wrote (config.yaml,
        and the folder itself if the run made it), so that a failure leaves no half-written output."""
        if any(p for pattern in files for p in self.dir.glob(pattern)):
            return
        if self.made:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif not self.path("run.json").exists():
            self.path("config.yaml").unlink(missing_ok=True)

    def finish(self, **extra) -> dict:
        """Write run.json: versions, device, seed, git commit, wall time, and what the experiment adds."""
        info = {
            "recipe": self.recipe.name,
            "ntkcli": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": str(resolve_device(self.recipe.device)),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads(),
            "seed": self.recipe.seed,
            "git_commit": _git_commit(),
            "wall_seconds": round(time.time() - self.started, 3),
            **extra,
        }
        self.write_text("run.json", json.dumps(info, indent=2))
        return info


def _short(value) -> str:
    """A recipe value in a few characters (a section: its epochs, or its fields)."""
    if isinstance(value, dict):
        return f"{value['epochs']} epochs" if "epochs" in value else str(value)
    return str(value).replace(" ", "")


class Results:
    """A table measured point by point (one row or more per point, identified by `keys`): the rows of earlier
    runs, the points still to measure, and a save after every addition, so an interrupted run loses nothing
    and a re-run resumes. The one resume helper of every experiment."""

    def __init__(self, run: Run, keys: list[str], name: str = "results.csv", write: bool = True,
                 done: set[tuple] | None = None, ordered: bool = False):
        """`done`: for a table that accompanies another (curves beside results), the points that table
        finished; rows of any other point (written before an interruption) are dropped and remeasured.
        `ordered`: the table's rows sorted by their keys (a point's own rows in the order they came), so that it
        does not depend on the order in which an executor's workers finished the points."""
        self.run, self.keys, self.name, self.write, self.ordered = run, keys, name, write, ordered
        previous = run.load_csv(name)
        if previous is not None and done is not None:
            previous = previous[[k in done for k in previous[keys].itertuples(index=False, name=None)]]
        self.frames = [] if previous is None or previous.empty else [previous]
        self.done = set() if not self.frames else set(previous[keys].itertuples(index=False, name=None))

    def todo(self, points) -> list[tuple]:
        """The points (key tuples) not measured yet, in their order."""
        return [p for p in points if tuple(p) not in self.done]

    def add(self, rows: pd.DataFrame | list[dict]) -> None:
        """New rows, saved at once; their points count as done."""
        rows = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        self.frames.append(rows)
        self.done |= set(rows[self.keys].itertuples(index=False, name=None))
        if self.write:
            self.run.save_csv(self.name, self.table())

    def table(self, wanted=None) -> pd.DataFrame:
        """Every row so far; with `wanted` (key tuples), only the rows of those points."""
        frames = [f for f in self.frames if not f.empty]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=self.keys)
        if self.ordered:
            df = df.sort_values(self.keys, kind="stable", ignore_index=True)
        if wanted is not None:
            wanted = set(wanted)
            keep = [k in wanted for k in df[self.keys].itertuples(index=False, name=None)]
            df = df[pd.Series(keep, index=df.index, dtype=bool)]  # a plain empty list would select no columns
        return df


def seed_for(*parts: int | float | str) -> int:
    """A stable 63-bit seed from the values that identify a point (base seed, regime value, N, m, repeat …):
    integers enter as they are, floats and strings through their exact text."""
    h = 1469598103934665603
    for p in parts:
        try:
            p = operator.index(p)
        except TypeError:
            p = int.from_bytes(hashlib.blake2b(repr(float(p) if isinstance(p, float) else p).encode(),
                                               digest_size=6).digest(), "little")
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def nested_randn(rows: int, shape: tuple[int, ...], *key: int | float | str, block: int = 4096) -> torch.Tensor:
    """rows × shape standard-normal float64 draws whose first k rows do not depend on `rows`: they come in
    blocks of `block` rows, each seeded by (key, block index). Growing a grid then leaves its old points alone."""
    blocks = [torch.randn(block, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed_for(*key, b)))
              for b in range(-(-rows // block))]
    return torch.cat(blocks)[:rows] if blocks else torch.empty(0, *shape, dtype=torch.float64)
