"""Recipes: YAML files validated by pydantic, with every field settable from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import UserError

APPROX_METHODS = ("compress-taylor2", "compress-favor", "compress-elu", "fit-lstsq", "fit-adam", "infinite-limit")
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
        need = self.peak_bytes()
        if need:
            import psutil
            import torch

            gpu = self.device != "cpu" and torch.cuda.is_available()
            have = torch.cuda.get_device_properties(0).total_memory if gpu else psutil.virtual_memory().total
            if need > have:
                raise ValueError(f"this recipe needs about {need / 2**30:.3g} GiB of memory, more than the "
                                 f"{have / 2**30:.3g} GiB of this machine's {'GPU' if gpu else 'RAM'}; lower its sizes")
        return self


class ApproxErrorRecipe(Recipe):
    """§4.4 / Figure 1: NTK-Attention vs exact attention with an m-long prefix."""

    d: int = Field(64, ge=1, le=1024, description="head dimension")
    seq_len: int = Field(128, ge=1, le=65536, description="input length L")
    max_log2m: int = Field(18, ge=1, le=30, description="prefix lengths m = 2^1 … 2^max_log2m")
    include_infinity: bool = Field(True, description="also evaluate m = ∞ (closed-form Gaussian limit)")
    n_train: Count = Field(32, description="training inputs for the fitted methods (paper: 40000)")
    n_test: Count = Field(8, description="test inputs the errors are measured on (paper: 8000)")
    repeats: int = Field(3, ge=1, le=10_000, description="independent draws of W and P (paper: 50)")
    weight_std: list[Positive] = Field([1.0, 0.125], min_length=1, description="entry std of W_Q, W_K, W_V; one regime each")
    prefix_std: float = Field(1.0, gt=0, description="entry std σ of the prefix P")
    score_scale: float | None = Field(None, gt=0, description="s in exp(s·q·k); null means 1/√d (paper text: 1)")
    protocol: Literal["text", "released"] = Field("text", description="text: prefix only in the exact side; released: in both")
    methods: list[Literal[APPROX_METHODS]] = Field(list(APPROX_METHODS), min_length=1)  # type: ignore[valid-type]
    favor_features: int = Field(256, ge=1, le=65536, description="random features of compress-favor")
    ridge: float = Field(1e-6, ge=0, description="relative ridge of fit-lstsq")
    adam_steps: Count = 300
    adam_lr: float = Field(1e-2, gt=0)
    adam_batch: Count = 1024
    chunk: int = Field(4096, ge=1, le=2**22, description="prefix rows per streamed chunk")
    dtype: Literal["float32", "float64"] = "float32"

    @model_validator(mode="after")
    def _released_is_quadratic(self) -> "ApproxErrorRecipe":
        if self.protocol == "released" and self.max_log2m > 12:
            raise ValueError("protocol 'released' costs (m+L)^2 per input, so max_log2m must be at most 12")
        return self

    @property
    def scale(self) -> float:
        return self.score_scale if self.score_scale is not None else self.d ** -0.5

    def peak_bytes(self) -> int:
        """The prefix (a float64 draw, its keys and values), q/k/v and the attention statistics of every query,
        one chunk of prefix scores for every query, and the test (train) queries' features of the compressing
        (fitted) methods."""
        rows, width = (self.n_train + self.n_test) * self.seq_len, 8 if self.dtype == "float64" else 4
        dphi = max([{"compress-taylor2": 1 + self.d + self.d * (self.d + 1) // 2,
                     "compress-favor": self.favor_features}.get(m, self.d) for m in self.methods])
        fits = any(m.startswith("fit-") for m in self.methods)
        return (16 * 2 ** self.max_log2m * self.d + width * (2 * 2 ** self.max_log2m * self.d + 8 * rows * self.d
                + 2 * rows * self.chunk + 2 * self.n_test * self.seq_len * dphi
                + (2 * self.n_train * self.seq_len * self.d if fits else 0)))


class ConvergenceRecipe(Recipe):
    """Thm 3.10 (paper 1) and Lemma 4.1 / Thm 5.5 / Lemma 5.3 (paper 2), checked in numbers."""

    parts: list[Literal["prefix", "transformer", "stand-in"]] = Field(["prefix", "transformer", "stand-in"], min_length=1)
    seeds: int = Field(1, ge=1, le=1000, description="independent initialisations per point")
    # prefix part: paper 1's one-token model, full-batch gradient descent
    n: int = Field(8, ge=1, le=4096, description="training points x_i with ‖x_i‖ = 1")
    d: int = Field(4, ge=1, le=256, description="dimension of x, of w_r and of the output")
    log2m: list[Log2m] = Field([4, 6, 8, 10, 12, 14], min_length=1, description="prefix lengths m = 2^j")
    signs: bool = Field(True, description="random ±1 signs a_r (Def C.2); false: a_r = 1 (Def 3.4)")
    steps: int = Field(8000, ge=2, le=10_000_000, description="gradient-descent steps of the prefix and stand-in parts")
    lr: float = Field(1.0, gt=0, description="step η = lr / λ_max(J Jᵀ at init), below the stability limit 2")
    checkpoints: int = Field(8, ge=2, le=10_000, description="times at which the kernel drift is measured")
    stand_in_features: Literal["taylor2", "favor"] = Field("taylor2", description="φ of the NTK-Attention stand-in")
    # transformer part: paper 2's model, SGD
    t_depths: list[Depth] = Field([1, 2, 4, 8], min_length=1, description="depths N")
    t_widths: list[Width] = Field([32, 128, 512, 2048], min_length=1, description="MLP widths m")
    t_n: int = Field(16, ge=1, le=4096, description="training sequences")
    t_seq_len: int = Field(4, ge=1, le=1024, description="tokens per sequence L")
    t_d: int = Field(8, ge=1, le=1024, description="embedding dimension d")
    t_steps: int = Field(400, ge=2, le=10_000_000, description="SGD steps")
    t_lr: float = Field(0.05, gt=0, description="SGD step size, the same for every depth and width (stable up to N = 8)")
    t_batch_fraction: float = Field(0.5, gt=0, le=1, description="α: batch size = α·n")
    t_epsilon: float = Field(1.0, gt=0, description="ε of Eq. (1)")
    t_omega: float = Field(0.25, gt=0, description="ω of the block, the same for every depth (ω = 1 explodes with N)")
    t_kappa: float | None = Field(None, gt=0, description="κ of the attention; null = 1/√m")
    t_causal: bool = True

    def peak_bytes(self) -> int:
        """Prefix part: the Jacobian (n·d × d·m) and the m-long prefix; transformer part: its layer kernels
        ((t_n·L·d)² per layer) and the Jacobian over every parameter."""
        m = 2 ** max(self.log2m) if "prefix" in self.parts or "stand-in" in self.parts else 0
        outputs = self.t_n * self.t_seq_len * self.t_d
        params = max(self.t_depths) * (max(self.t_widths) * self.t_d + self.t_d ** 2)
        transformer = 8 * 4 * (outputs * params + max(self.t_depths) * outputs ** 2)
        return 8 * 4 * self.n * self.d * self.d * m + (transformer if "transformer" in self.parts else 0)


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


class Section(BaseModel):
    model_config = STRICT


class ModelSpec(Section):
    name_or_path: str | None = Field(None, description="hub id, local folder, or pkg:<package>/<folder> for a "
                                     "model shipped inside an installed package")
    config: dict[str, Any] | None = Field(None, description="instead: a randomly initialised model from this config "
                                          "(model_type and sizes), or the architecture `pretrain` trains")
    tokenizer: str | None = Field(None, description="tokenizer location; defaults to name_or_path")
    trust_remote_code: bool = Field(False, description="run modelling code downloaded from the hub (avoid it: "
                                    "ChatGLM3 loads natively without it)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("give exactly one of name_or_path and config")
        return self


class DataSpec(Section):
    name: str | None = Field(None, description="hub data set (e.g. aps/super_glue), or 'digits' (scikit-learn, offline)")
    config: str | None = Field(None, description="hub configuration (e.g. rte)")
    path: str | None = Field(None, description="local folder or file instead of the hub: JSONL, TSV, CSV, parquet, "
                             "or image folders per split")
    text_fields: list[str] = Field([], max_length=2, description="one or two fields, or templates like "
                                   "'{premise} What was the {question}?'")
    image_field: str | None = Field(None, description="the image column of an image task")
    label_field: str = "label"
    label_names: list[str] | None = Field(None, description="label strings in class order (local files)")
    num_labels: int = Field(..., ge=2)
    classes: list[int] | None = Field(None, description="keep only these labels, renumbered 0, 1, … (digits 5–9)")
    train_split: str = "train"
    eval_split: str = "validation"
    eval_fraction: float = Field(0.3, gt=0, lt=1, description="digits: share held out for evaluation")
    max_length: int = Field(128, ge=8, description="tokens per text field")
    max_train_samples: int | None = Field(None, ge=1)
    max_eval_samples: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _has_inputs(self) -> "DataSpec":
        if self.name is None and self.path is None:
            raise ValueError("give a hub name (or 'digits') or a local path")
        if bool(self.text_fields) == (self.image_field is not None):
            raise ValueError("give text_fields for a text task or image_field for an image task")
        if self.classes is not None and len(self.classes) != self.num_labels:
            raise ValueError(f"classes lists {len(self.classes)} labels but num_labels is {self.num_labels}")
        return self


class TrainSpec(Section):
    epochs: int = Field(3, ge=1, le=100_000)
    batch_size: int = Field(32, ge=1, le=1_000_000)
    eval_batch_size: int = Field(64, ge=1, le=1_000_000)
    lr: float = Field(1e-3, gt=0, description="AdamW step of the PEFT methods (the paper's 1e-3)")
    fft_lr: float = Field(5e-5, gt=0, description="AdamW step of full fine-tuning")
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field("auto", description="auto: bf16 on a GPU that has it, else fp32")


class PretrainSpec(Section):
    """Train the `model.config` architecture from scratch on other classes first (cached in the run folder)."""

    classes: list[int] = Field(..., min_length=2)
    epochs: int = Field(20, ge=1, le=100_000)
    batch_size: int = Field(64, ge=1, le=1_000_000)
    lr: float = Field(1e-3, gt=0)


def _method_specs():
    from .adapters import lora, ntk, ptuning_v2
    from .adapters.common import Options

    class Common(Section):
        lr: float | None = Field(None, gt=0, description="overrides train.lr / train.fft_lr")
        label: str | None = Field(None, description="name in tables; defaults to the method and its size")

    class NTK(ntk.NTKOptions, Common):
        method: Literal["ntk"]

    class PTuning(ptuning_v2.PTuningOptions, Common):
        method: Literal["ptuning-v2"]

    class Lora(lora.LoraOptions, Common):
        method: Literal["lora"]

    class FFT(Options, Common):
        method: Literal["fft"]

    return NTK | PTuning | Lora | FFT


MethodSpec = Annotated[_method_specs(), Field(discriminator="method")]


def method_label(spec) -> str:
    if spec.label:
        return spec.label
    size = {"ptuning-v2": lambda s: f" m={s.prefix_length}", "lora": lambda s: f" r={s.r}"}.get(spec.method)
    return spec.method + (size(spec) if size else "")


def method_options(spec) -> dict[str, Any]:
    return spec.model_dump(exclude={"method", "lr", "label"})


class FinetuneRecipe(Recipe):
    """§5, Tables 1–2: NTK-Attention vs P-Tuning v2 vs LoRA vs full fine-tuning, several seeds."""

    model: ModelSpec
    data: DataSpec
    methods: list[MethodSpec] = Field(..., min_length=1)  # type: ignore[valid-type]
    train: TrainSpec = TrainSpec()
    seeds: list[Seed] = Field([0, 1, 2], min_length=1)
    pretrain: PretrainSpec | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "FinetuneRecipe":
        labels = [method_label(m) for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ValueError(f"method labels must differ (got {labels}); set a label per method")
        if self.pretrain is not None and self.model.config is None:
            raise ValueError("pretrain trains model.config from scratch; give model.config, not name_or_path")
        return self


class ScalingLawRecipe(Recipe):
    """Paper 2, Theorems 7.1–7.2: teacher–student sweeps of training time T, data size N and model size M."""

    sweeps: list[Literal["time", "data", "model", "compute"]] = Field(["time", "data", "model", "compute"], min_length=1)
    seeds: int = Field(3, ge=1, le=1000, description="independent students (init, data, noise) per sweep point")
    # the model (paper 2, Eq. 1) — students and the transformer teacher share d, L and the coefficients
    d: int = Field(8, ge=1, le=1024, description="embedding dimension d")
    seq_len: int = Field(4, ge=1, le=1024, description="tokens per sequence L")
    epsilon: float = Field(1.0, gt=0, description="ε of Eq. (1)")
    omega: float = Field(0.25, gt=0, description="ω of each block")
    kappa: float | None = Field(None, gt=0, description="κ of the attention; null = 1/√m")
    causal: bool = True
    # the data
    teacher: Literal["transformer", "mlp"] = Field("transformer", description="F*: paper 2's model (wider), or a "
                                                   "token-wise tanh MLP on the same residual stream")
    teacher_width: Width = Field(512, description="m of the teacher")
    teacher_depth: Depth = Field(1, description="N of the teacher (transformer)")
    noise: float = Field(0.1, ge=0, description="ξ: std of the label noise Y = F*(X) + ξ·G")
    n_test: Count = Field(512, description="fresh noiseless test sequences for the excess risk")
    # the sweep grid
    n_values: list[Count] = Field([8, 16, 32, 64, 128, 256], min_length=3, description="data sizes N")
    widths: list[Width] = Field([8, 16, 32, 64, 128, 256], min_length=3, description="student widths m")
    depths: list[Depth] = Field([1, 2], min_length=1, description="student depths (model law)")
    base_n: int = Field(64, ge=1, description="N held fixed in the time and model laws")
    base_width: int = Field(64, ge=1, description="m held fixed in the time and data laws")
    base_depth: int = Field(1, ge=1, description="depth of the time, data and compute sweeps")
    # training
    steps: int = Field(2000, ge=2, le=10_000_000, description="SGD steps T of every student")
    checkpoints: int = Field(24, ge=3, le=10_000, description="log-spaced steps at which the excess risk is measured")
    lr: float = Field(0.5, gt=0, description="SGD step on ½·mean‖F(X) − Y‖²")
    batch_fraction: float = Field(0.25, gt=0, le=1, description="α: |B| = max(1, round(α·N))")
    bootstrap: int = Field(200, ge=10, le=100_000, description="bootstrap resamples per fit")
    dtype: Literal["float32", "float64"] = "float32"

    def peak_bytes(self) -> int:
        """The largest group of students trained at once (every N of a width, or every depth at base_n): their
        parameters and gradients, and the MLP activations of their whole training set and of the test set."""
        width, w = (8 if self.dtype == "float64" else 4), max(self.widths)
        groups = [(self.seeds * len(self.n_values), max(self.n_values), self.base_depth),
                  (self.seeds, self.base_n, max(self.depths))]
        return width * max(students * (4 * depth * (w * self.d + self.d ** 2)
                                       + 3 * (n + self.n_test) * self.seq_len * w * depth)
                           for students, n, depth in groups)

    @model_validator(mode="after")
    def _base_in_grid(self) -> "ScalingLawRecipe":
        for name, value, grid in (("base_n", self.base_n, self.n_values), ("base_width", self.base_width, self.widths)):
            if value not in grid:
                raise ValueError(f"{name} = {value} must be one of {'n_values' if name == 'base_n' else 'widths'} {grid}")
        if self.base_depth not in self.depths:
            raise ValueError(f"base_depth = {self.base_depth} must be one of depths {self.depths}")
        return self
