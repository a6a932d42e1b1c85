"""The recipe of `ntk superglue`: a model, the tasks, and methods each with a learning-rate grid (and, for a
method worth trying several ways, variants of its options), seeds, and the selection and bootstrap settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PositiveFloat, TypeAdapter, model_validator

from ...recipes import Recipe, Section, Seed
from ..finetune.recipe import MethodSpec, ModelSpec, TrainSpec, method_label
from .tasks import TASKS

TaskName = Literal[tuple(TASKS)]  # type: ignore[valid-type]
CONTROL = "majority"  # the majority-class control: the train split's most frequent label for every evaluation row


class SuperGlueData(Section):
    name: str = Field("aps/super_glue", description="the hub data set (used when path is not given)")
    path: str | None = Field(None, description="a local SuperGLUE folder (<Task>/train.jsonl, val.jsonl), or with one "
                             "task that task's own folder (GLUE's RTE train.tsv/dev.tsv too)")
    tasks: list[TaskName] = Field(["boolq", "cb", "copa", "multirc"], min_length=1)  # type: ignore[valid-type]
    max_length: int = Field(64, ge=8, le=4096, description="tokens per text field (a pair is cut to twice this, "
                            "longest field first)")
    max_lengths: dict[TaskName, Annotated[int, Field(ge=8, le=4096)]] = Field(  # type: ignore[valid-type]
        {}, description="task → tokens per text field, instead of max_length")
    epochs: dict[TaskName, Annotated[int, Field(ge=1, le=100_000)]] = Field(  # type: ignore[valid-type]
        {}, description="task → training epochs, instead of train.epochs")
    max_train: dict[TaskName, int] = Field({}, description="task → at most this many train rows (whole MultiRC "  # type: ignore[valid-type]
                                           "questions), seeded; limits of tasks not in `tasks` are unused")
    max_eval: dict[TaskName, int] = Field({}, description="task → at most this many evaluation rows")  # type: ignore[valid-type]
    carve_eval: float = Field(0.5, gt=0, lt=1, description="a task without a train split (the shared BoolQ): the "
                              "share of its validation file held out for evaluation; the rest is train")
    folds: dict[TaskName, Annotated[int, Field(ge=2, le=1000)]] = Field(  # type: ignore[valid-type]
        {}, description="task → k: also score the task by stratified k-fold cross-validation over train ∪ "
        "validation (each fold's step chosen inside its own training part; every seed), beside the official split")

    def length(self, task: str) -> int:
        return self.max_lengths.get(task, self.max_length)

    @model_validator(mode="after")
    def _positive_caps(self) -> "SuperGlueData":
        bad = {k: v for k, v in {**self.max_train, **self.max_eval}.items() if v < 2}
        if bad:
            raise ValueError(f"row limits must be at least 2 (got {bad})")
        return self


GRID = [0.0003, 0.001, 0.003, 0.01, 0.03]  # the one step grid of every PEFT method (3e-4 … 3e-2)


class Selection(Section):
    """How each (task, method)'s learning rate is chosen: on a share of train held out, never the evaluation split;
    and how the comparisons are judged."""

    val_fraction: float = Field(0.2, gt=0, lt=1, description="share of train held out to choose the step")
    grid: list[PositiveFloat] = Field(GRID, min_length=1, description="the step grid of every method that gives "
                                      "no `lrs` of its own (the same grid for every PEFT method)")
    grow: int = Field(2, ge=0, le=10, description="a chosen step at an edge of its grid adds up to this many "
                      "points beyond that edge, one at a time (the grid's own ratio)")
    bootstrap: int = Field(2000, ge=100, le=100_000, description="bootstrap replicates of the paired intervals")
    margin: float = Field(2.0, ge=0, le=100, allow_inf_nan=False, description="non-inferiority margin δ in "
                          "accuracy points, fixed before the run: NTK-Attention ≥ LoRA − δ")
    aa_seeds: list[Seed] = Field([], description="the A/A control: each A/A method's chosen point trained again "
                                 "with these seeds (as many as `seeds`, none of them) and compared with itself by "
                                 "the claims' rule; [] for none")
    aa_methods: list[str] | None = Field(None, description="labels of the methods the A/A control retrains (null: "
                                         "every method)")


class PaperBudget(Section):
    """The paper's-step view: the paper's one step (train.lr, train.fft_lr) with the paper's own budget
    (Appendix K: 30 epochs at batch 32)."""

    run: bool = Field(True, description="false: the view is not run, and its claims say so")
    epochs: int | None = Field(None, ge=1, le=100_000, description="epochs of every paper-view run (null: the "
                               "chosen view's, and the two views share their runs where the step is the same)")
    batch_size: int | None = Field(None, ge=1, le=65536, description="batch of every paper-view run (null: "
                                   "train.batch_size)")
    seeds: int | None = Field(None, ge=1, le=1000, description="the paper-view runs use the first this-many seeds "
                              "(null: all)")
    folds: bool = Field(True, description="false: the view runs on the official split only, not on data.folds' k "
                        "folds (each fold adds the view's runs at the paper's budget)")

    @property
    def own(self) -> bool:
        """Whether the view trains with a budget of its own (so never shares a run with the chosen view)."""
        return self.epochs is not None or self.batch_size is not None


METHOD = TypeAdapter(MethodSpec)


class TunedMethod(Section):
    """A method entry (as in `ntk finetune`) plus `lrs`, its grid (selection.grid when not given), and optional
    `variants` (option overrides)."""

    spec: MethodSpec  # type: ignore[valid-type]
    lrs: list[PositiveFloat] | None = Field(None, min_length=1)
    variants: list[dict[str, Any]] = Field([{}], min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, entry: Any) -> Any:
        if isinstance(entry, dict) and "spec" not in entry:
            entry = dict(entry)
            return {"lrs": entry.pop("lrs", None), "variants": entry.pop("variants", [{}]), "spec": entry}
        return entry

    @model_validator(mode="after")
    def _variants_valid(self) -> "TunedMethod":
        self.candidates()
        return self

    @property
    def label(self) -> str:
        return method_label(self.spec)

    @property
    def kind(self) -> str:
        return self.spec.method

    def candidates(self) -> list[Any]:
        """The method spec of every variant (the base entry with that variant's options)."""
        base = self.spec.model_dump(exclude_unset=True)
        return [METHOD.validate_python({**base, **variant}) for variant in self.variants]


def variant_name(variant: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in variant.items()) or "default"


class SuperGlueRecipe(Recipe):
    """Paper 1, Table 2 on real SuperGLUE at small scale: every method tuned on held-out train, several seeds."""

    model: ModelSpec
    data: SuperGlueData = SuperGlueData()
    train: TrainSpec = Field(TrainSpec(), description="epochs, batch sizes; lr and fft_lr are the paper's protocol "
                             "(one step for every PEFT method), the second view of the results")
    methods: list[TunedMethod] = Field(..., min_length=1)
    seeds: list[Seed] = Field([0, 1, 2], min_length=1)
    selection: Selection = Selection()
    paper: PaperBudget = PaperBudget()

    def lrs(self, method: TunedMethod) -> list[float]:
        """A method's step grid, in increasing order."""
        return sorted(method.lrs or self.selection.grid)

    def epochs(self, task: str) -> int:
        """Training epochs of the task's runs."""
        return self.data.epochs.get(task, self.train.epochs)

    def budget(self, stage: str, task: str) -> tuple[int, int]:
        """(epochs, batch size) of a run at `stage`: the paper's budget for the paper view's own stages."""
        if stage.startswith("paper"):
            return self.paper.epochs or self.epochs(task), self.paper.batch_size or self.train.batch_size
        return self.epochs(task), self.train.batch_size

    def aa_labels(self) -> list[str]:
        """The methods the A/A control retrains (none without aa_seeds)."""
        if not self.selection.aa_seeds:
            return []
        return self.selection.aa_methods if self.selection.aa_methods is not None else [m.label for m in self.methods]

    @model_validator(mode="after")
    def _labels_differ(self) -> "SuperGlueRecipe":
        labels = [m.label for m in self.methods]
        if CONTROL in labels:
            raise ValueError(f"the label {CONTROL!r} is the majority-class control every table has; choose another")
        if len(set(labels)) != len(labels):
            raise ValueError(f"method labels must differ (got {labels}); set a label per method")
        aa = self.selection.aa_seeds
        if aa and (len(aa) != len(self.seeds) or set(aa) & set(self.seeds) or len(set(aa)) != len(aa)):
            raise ValueError(f"selection.aa_seeds must be as many distinct seeds as seeds ({len(self.seeds)}), none of "
                             f"them in seeds (got {aa})")
        unknown = set(self.selection.aa_methods or []) - set(labels)
        if unknown:
            raise ValueError(f"selection.aa_methods names no method of this recipe: {sorted(unknown)} (the methods: "
                             f"{labels})")
        return self
