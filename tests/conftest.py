"""Tests run offline (no hub access). The helpers every test module shares: invoking the CLI, checking a
one-line error, and writing small local data sets."""

import json
import os
from pathlib import Path

from typer.testing import CliRunner

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")

from ntkcli.cli import app  # noqa: E402 — after the environment above

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in result.output


def no_results(root: Path) -> bool:
    return not list(root.rglob("results.csv"))


def write_rte(folder: Path, kind: str) -> Path:
    """A small RTE in GLUE's TSV layout (train.tsv, dev.tsv) or SuperGLUE's JSONL (train.jsonl, val.jsonl)."""
    folder.mkdir()
    rows = [(f'The "team" {v} the bridge on day {i}.', f"The team {v if i % 2 == 0 else 'never ' + v} the bridge.",
             "entailment" if i % 2 == 0 else "not_entailment") for i, v in enumerate(["crossed", "built", "sold"] * 8)]
    for split, part in (("train", rows[:16]), ("dev" if kind == "glue" else "val", rows[16:])):
        if kind == "glue":
            lines = ["index\tsentence1\tsentence2\tlabel"] + [f"{i}\t{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(part)]
            (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
        else:
            lines = [json.dumps({"premise": a, "hypothesis": b, "label": y, "idx": i}) for i, (a, b, y) in enumerate(part)]
            (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder



ANIMALS = "horse tiger rabbit parrot turtle dragon camel zebra eagle otter monkey donkey".split()
THINGS = "hammer ladder kettle wallet candle bottle pencil helmet basket magnet mirror ribbon".split()
FILLER = ("river stone cloud paper glass music table garden window bread forest silver island winter yellow "
          "market ocean planet desert ginger jungle lemon orange pepper quartz violin anchor cactus").split()


def write_category_pairs(folder: Path, train: int = 160, evaluation: int = 80, seed: int = 0) -> Path:
    """A learnable text-pair task in RTE's SuperGLUE layout (train.jsonl, val.jsonl): text_a is 1 to 60 filler
    words, text_b names an animal (entailment) or a thing (not_entailment). Rows differ widely in length, so a
    length-grouping sampler reorders them, and the label has nothing to do with the length."""
    import random

    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for split, n in (("train", train), ("val", evaluation)):
        lines = []
        for i in range(n):
            filler = " ".join(rng.choice(FILLER) for _ in range(rng.choice([1, 2, 4, 8, 16, 30, 60])))
            word, label = (rng.choice(ANIMALS), "entailment") if i % 2 == 0 else (rng.choice(THINGS), "not_entailment")
            lines.append(json.dumps({"premise": filler, "hypothesis": f"It is about the {word}.", "label": label,
                                     "idx": i}))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder
