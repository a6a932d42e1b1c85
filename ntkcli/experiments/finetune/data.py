"""Data for fine-tuning: hub data sets, local files, or scikit-learn's digits, as (inputs, label) rows.

Text tasks keep one or two strings per example, built from the recipe's field names or templates
("{premise} What was the {question}?"), so pair tasks (RTE, CB, BoolQ) and tasks cast as pairs
(COPA, MultiRC) share one path. Image tasks keep an image per example and turn it into
pixel_values lazily.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import UserError, first_line, root_cause
from .recipe import DataSpec

SPLIT_FILES = {"train": ("train",), "validation": ("validation", "val", "dev"), "test": ("test",)}
SUFFIXES = {".jsonl": "json", ".json": "json", ".tsv": "csv", ".csv": "csv", ".parquet": "parquet"}
FIELD = re.compile(r"\{(\w+)\}")


def split_files(path: Path, split: str) -> list[Path]:
    """The data files of one split in a local folder (train.jsonl, val.tsv, …); a path of that name that is not a
    regular file is an error, not a missing split."""
    found = [path / f"{s}{suffix}" for s in SPLIT_FILES.get(split, (split,)) for suffix in SUFFIXES
             if (path / f"{s}{suffix}").exists()]
    odd = [f for f in found if not f.is_file()]
    if odd:
        raise UserError(f"{odd[0]} is not a data file (a folder or a device)")
    return found


def _local_split(path: Path, split: str):
    """(builder, load_dataset keywords) for one split of a local folder or file."""
    if path.is_file():
        files = [path]
    else:
        stems = SPLIT_FILES.get(split, (split,))
        files = split_files(path, split)
        folders = [path / s for s in stems if (path / s).is_dir()]
        if not files and folders:
            return "imagefolder", {"data_dir": str(folders[0])}
    if not files or files[0].suffix not in SUFFIXES:
        looked = ", ".join(f"{s}{{{','.join(SUFFIXES)}}}" for s in SPLIT_FILES.get(split, (split,)))
        raise UserError(f"no {split} data in {path} (looked for {looked} or an image folder)")
    extra = {"delimiter": "\t", "quoting": 3} if files[0].suffix == ".tsv" else {}  # GLUE TSV: no quoting
    return SUFFIXES[files[0].suffix], {"data_files": str(files[0]), **extra}


def read(spec: DataSpec, split: str):
    """One split as stored: the hub data set's, or the local file's (a missing path or split is one line)."""
    from datasets import load_dataset

    if spec.path is not None:
        path = Path(spec.path).expanduser()
        if not path.exists():
            raise UserError(f"data path not found: {path}")
        builder, kwargs = _local_split(path, split)
        if builder != "imagefolder":
            _decodes(Path(kwargs["data_files"]))
        try:
            return load_dataset(builder, split="train", **kwargs)
        except Exception as err:  # noqa: BLE001 — any parser failure is the user's file
            raise UserError(f"cannot read {split} data from {kwargs.get('data_files', path)}: "
                            f"{first_line(root_cause(err))}") from None
    try:
        return load_dataset(spec.name, spec.config, split=split)
    except Exception as err:  # noqa: BLE001 — offline, unknown name, unknown split: all one clear line
        raise UserError(f"data set {spec.name!r} ({spec.config or 'default'}, split {split}) is not reachable: "
                        f"{first_line(err)} "
                        "(offline? use --set data.path=DIR with local files)") from None


def _decodes(file: Path) -> None:
    """A text data file must be UTF-8 throughout (parquet is binary); the first bad byte is named."""
    if file.suffix == ".parquet":
        return
    number = 0
    try:
        with open(file, encoding="utf-8") as f:
            for number, _ in enumerate(f, 1):
                pass
    except UnicodeDecodeError as err:
        raise UserError(f"{file}: not UTF-8 text (line {number + 1}: {err.reason})") from None
    except OSError as err:
        raise UserError(f"cannot read {file}: {err.strerror or err}") from None


def _digits(spec: DataSpec, classes: list[int] | None, seed: int, split: str):
    """scikit-learn's 8×8 digits (values scaled to [0, 1]), a seeded stratified split."""
    from datasets import Dataset
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    keep = np.isin(digits.target, classes) if classes is not None else np.ones(len(digits.target), bool)
    images, labels = digits.images[keep] / 16.0, digits.target[keep]
    train, held = train_test_split(np.arange(len(labels)), test_size=spec.eval_fraction, random_state=seed,
                                   stratify=labels)
    rows = train if split == spec.train_split else held
    return Dataset.from_dict({"image": images[rows].astype(np.float32), "label": labels[rows]})


def _text(row: dict, field: str) -> str:
    """A field's text: a name, alternatives 'premise|sentence1' (the first present), or a template."""
    names = FIELD.findall(field) or [next((n for n in field.split("|") if n in row), field)]
    missing = [n for n in names if n not in row]
    if missing:
        raise UserError(f"the data has no field '{missing[0]}' (it has: {', '.join(row)})")
    return field.format(**row) if FIELD.search(field) else str(row[names[0]])


def _label(value, spec: DataSpec) -> int:
    if value is None:
        raise UserError(f"a row has no {spec.label_field} (null); every row of a split needs one")
    if isinstance(value, str):
        if spec.label_names is None:
            raise UserError(f"labels are strings (e.g. {value!r}); list them in data.label_names")
        if value not in spec.label_names:
            raise UserError(f"label {value!r} is not in data.label_names {spec.label_names}")
        return spec.label_names.index(value)
    return int(value)


def load_split(spec: DataSpec, split: str, seed: int, classes: list[int] | None = None, limit: int | None = None):
    """One split as a datasets.Dataset with `label` in 0 … n−1 and `text_a`[, `text_b`] or `image`."""
    classes = classes if classes is not None else spec.classes
    ds = _digits(spec, classes, seed, split) if spec.name == "digits" and spec.path is None else read(spec, split)
    if spec.label_field in ds.column_names and limit is not None and len(ds) > limit:
        ds = ds.shuffle(seed=seed).select(range(limit))
    return cast(ds, spec, split, classes)


def cast(ds, spec: DataSpec, split: str, classes: list[int] | None = None, keep: tuple[str, ...] = ()):
    """Rows as stored → `label` in 0 … n−1 and `text_a`[, `text_b`] (from the spec's fields) or `image`;
    the columns in `keep` stay as they are."""
    if spec.label_field not in ds.column_names:
        raise UserError(f"the data has no label field '{spec.label_field}' (it has: {', '.join(ds.column_names)})")
    image = spec.image_field
    if image is not None and image not in ds.column_names:
        raise UserError(f"the data has no image field '{image}' (it has: {', '.join(ds.column_names)})")

    def convert(row: dict) -> dict:
        out = {"_label": _label(row[spec.label_field], spec)}
        if image is None:
            out.update({f"text_{'ab'[i]}": _text(row, f) for i, f in enumerate(spec.text_fields)})
        return out

    kept = [image] if image is not None else []
    ds = ds.map(convert, remove_columns=[c for c in ds.column_names if c not in [*kept, *keep]])
    ds = ds.rename_column("_label", "label")
    if image is not None and image != "image":
        ds = ds.rename_column(image, "image")
    if classes is not None:
        ds = ds.filter(lambda r: r["label"] in classes)
        ds = ds.map(lambda r: {"label": classes.index(r["label"])})
    bad = [y for y in set(ds["label"]) if not 0 <= y < (len(classes) if classes else spec.num_labels)]
    if bad:
        raise UserError(f"label {bad[0]} is outside 0 … {spec.num_labels - 1}; check data.num_labels "
                        f"(or data.classes) for the {split} split")
    return ds


def tokenize(ds, tokenizer, max_length: int):
    """input_ids etc. for one or two text fields; a pair is cut to max_length per field, longest first."""
    pair = "text_b" in ds.column_names

    def encode(batch):
        args = (batch["text_a"], batch["text_b"]) if pair else (batch["text_a"],)
        return tokenizer(*args, truncation=True, max_length=max_length * len(args))

    return ds.map(encode, batched=True, remove_columns=[c for c in ds.column_names if c.startswith("text_")])


def pixels(image, size: int, channels: int) -> torch.Tensor:
    """An image (PIL, or an array in [0, 1]) as a [channels, size, size] tensor normalised to [-1, 1]."""
    if hasattr(image, "convert"):
        image = np.asarray(image.convert("RGB" if channels == 3 else "L"), dtype=np.float32) / 255.0
    t = torch.as_tensor(np.asarray(image, dtype=np.float32))
    t = t.unsqueeze(0) if t.ndim == 2 else t.permute(2, 0, 1)
    t = t.expand(channels, -1, -1) if t.shape[0] == 1 else t[:channels]
    if t.shape[-2:] != (size, size):
        t = F.interpolate(t[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    return (t - 0.5) / 0.5


def with_pixels(ds, size: int, channels: int):
    """The dataset with `image` turned into `pixel_values` on access (its other columns, the row ids of an
    evaluation among them, pass through)."""
    def transform(batch):
        rest = {k: v for k, v in batch.items() if k != "image"}
        return {"pixel_values": [pixels(img, size, channels) for img in batch["image"]], **rest}
    return ds.with_transform(transform)
