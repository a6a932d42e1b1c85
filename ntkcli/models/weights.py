"""Weight files checked without loading them: a safetensors file's header says every tensor's name, shape and byte
range, so an empty, cut or foreign file is found by reading a few bytes; a PyTorch .bin is opened lazily (mmap)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """name → shape of every tensor in one weight file; a ValueError says what is wrong with a broken one."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise ValueError(f"{path} is {'empty' if path.is_file() else 'missing'}")
    if path.suffix != ".safetensors":
        import torch

        try:
            return {k: tuple(v.shape) for k, v in torch.load(path, map_location="cpu", mmap=True,
                                                              weights_only=True).items()}
        except Exception as err:  # noqa: BLE001 — a cut zip, a pickle of something else: the file is broken
            raise ValueError(f"{path} is not a readable PyTorch weight file ({str(err).splitlines()[0]})") from None
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if not 2 <= length <= size - 8:
            raise ValueError(f"{path} is not a safetensors file (its header length {length} does not fit its "
                             f"{size} bytes)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"{path} is not a safetensors file (its header is not JSON)") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
    if 8 + length + end != size:
        raise ValueError(f"{path} is cut short or padded: its header describes {8 + length + end} bytes, the file "
                         f"has {size}")
    return {k: tuple(v["shape"]) for k, v in tensors.items()}


def weight_files(folder: Path) -> list[Path]:
    """A local model folder's weight files: the shards its index names (each must exist), or its one weight file."""
    for index in INDEXES:
        if (folder / index).is_file():
            try:
                shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError):
                raise ValueError(f"{folder / index} is not a readable index of weight shards") from None
            return [folder / s for s in shards]
    return [folder / f for f in SINGLE_FILES if (folder / f).exists()][:1]


def check_folder(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every weight file of a local model folder readable: name → shape of all its tensors."""
    files = weight_files(folder)
    if not files:
        raise ValueError(f"no {' or '.join(SINGLE_FILES)} (or their index) in {folder}")
    return {name: shape for f in files for name, shape in tensor_shapes(f).items()}
