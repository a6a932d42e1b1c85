"""Recipes: YAML files validated by pydantic, with every field settable from the command line.

The schemas every experiment shares come first (the base `Recipe`, `Section`, value types, paper 2's
model); each experiment declares its own recipe class in its module. Loading comes after: YAML, --set
overrides and validation errors as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import UserError
from .memory import beyond_memory

STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)  # unknown keys, NaN and ±inf are errors everywhere
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
Positive = Annotated[float, Field(gt=0)]
# list entries, each with bounds that keep one run within a workstation's memory (the memory check below
# catches the combinations)
Log2m = Annotated[int, Field(ge=1, le=24)]
Depth = Annotated[int, Field(ge=1, le=64)]
Width = Annotated[int, Field(ge=1, le=65536)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]


class Recipe(BaseModel):
    """Fields every command shares."""

    model_config = ConfigDict(**STRICT, validate_assignment=True)
    name: str | None = Field(None, description="run folder name (inside `out`); defaults to the recipe file's stem")
    seed: Seed = Field(0, description="base seed of every random draw")
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="where tensors live; auto picks cuda if present")
    out: str = Field("outputs", min_length=1, description="root folder of all runs")
    executor: Literal["auto", "serial", "local", "ray"] = Field(
        "auto", description="who measures the grid's points: serial (this process), local worker processes, or Ray "
                            "tasks; auto is serial for one worker, local for more (experiments with a grid of runs)")
    workers: int = Field(1, ge=1, le=4096, description="points measured at once (local processes or Ray tasks)")
    address: str | None = Field(None, min_length=1, description="a Ray cluster's address for the ray executor: "
                                                                "host:port, ray://host:port or auto")
    threads: int | None = Field(None, ge=1, le=4096, description="intra-op threads of each point, whoever measures "
                                "it (null: this machine's cores divided among the workers). CPU sums split by "
                                "thread: the same threads give the same CSVs, bit for bit, on any executor")

    @field_validator("name")
    @classmethod
    def _stays_inside_out(cls, name: str | None) -> str | None:
        if name is not None and (name.strip() in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name):
            raise ValueError("a run name is one folder name inside `out` (no '/', not '.' or '..')")
        return name

    def peak_bytes(self) -> int:
        """A rough upper estimate of the memory one run needs (0: not estimated)."""
        return 0

    @model_validator(mode="after")
    def _fits_memory(self) -> "Recipe":
        too_much = beyond_memory(self.peak_bytes(), self.device)
        if too_much:
            raise ValueError(f"this recipe {too_much}; lower its sizes")
        return self


class Section(BaseModel):
    model_config = STRICT



class TransformerSpec(Section):
    """Paper 2's model (Eq. 1), declared once for `convergence` and `scaling-law`: F(X) = ε·F_N(…F_1(X+E)…),
    F_ν(X) = (ω/√m)·ReLU(Softmax(κ·X U Xᵀ + M)·X W)·A + X. Its depth N and width m vary per run."""

    d: int = Field(8, ge=1, le=1024, description="embedding dimension d")
    seq_len: int = Field(4, ge=1, le=1024, description="tokens per sequence L")
    epsilon: float = Field(1.0, gt=0, description="ε of Eq. (1)")
    omega: float = Field(0.25, gt=0, description="ω of each block, the same for every depth (ω = 1 explodes with N)")
    kappa: float | None = Field(None, gt=0, description="κ of the attention; null = 1/√m")
    causal: bool = True

    def shape(self, width: int, depth: int):
        """theory.transformer.Shape of a model with this width m and depth N."""
        from .theory.transformer import Shape

        return Shape(self.d, width, depth, self.seq_len, self.epsilon, self.omega, self.kappa, self.causal)


R = TypeVar("R", bound=Recipe)


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"--set {dotted}: '{key}' is not a section of the recipe")
    node[leaf] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """--set key.sub=value pairs as {dotted key: YAML-parsed value}."""
    out = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--set expects key=value, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"recipe file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise UserError(f"cannot read recipe {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe must be a mapping of fields, got {type(data).__name__}")
    return data


def _explain(err: ValidationError) -> str:
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "recipe"
    if e["type"] == "extra_forbidden":
        return f"unknown recipe field '{where}'"
    got = e.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:
        return f"invalid recipe: {msg}"
    return f"recipe field '{where}': {msg}{shown}"


def load_recipe(cls: type[R], path: Path | None, overrides: dict[str, Any]) -> R:
    """The recipe at `path` (or the defaults), with dotted overrides applied, validated."""
    data = read_yaml(path) if path is not None else {}
    for key, value in overrides.items():
        _set_path(data, key, value)
    data.setdefault("name", path.stem if path is not None else "default")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise UserError(_explain(err)) from None
