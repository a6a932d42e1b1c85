"""How much memory a run may use, and allocation failures as one line.

The limit is the smallest of what binds the process: the machine's RAM (the GPU's for a CUDA run), the
address-space limit (`ulimit -v`, RLIMIT_AS) less what the process has mapped already, and its cgroup's memory
limit (a container's) less what the cgroup uses already.
"""

from __future__ import annotations

import re
import resource
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
CGROUP_FILES = (("memory.max", "memory.current"),  # cgroup v2
                ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))  # cgroup v1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _mapped_bytes() -> int:
    """The process's virtual size (what RLIMIT_AS counts)."""
    import psutil

    return psutil.Process().memory_info().vms


def limits(device: str = "cpu") -> list[tuple[int, str]]:
    """(bytes available, what sets it) for every limit that binds a run on `device`."""
    import psutil
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return [(torch.cuda.get_device_properties(0).total_memory, "this machine's GPU")]
    found = [(psutil.virtual_memory().total, "this machine's RAM")]
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        found.append((max(soft - _mapped_bytes(), 0), f"the process's address-space limit (ulimit -v, "
                                                      f"{soft / 2**30:.3g} GiB)"))
    for limit_file, usage_file in CGROUP_FILES:
        limit = _read_int(CGROUP / limit_file)
        if limit is not None and limit < 1 << 60:  # cgroup v1 writes a huge number for "no limit"
            used = _read_int(CGROUP / usage_file) or 0
            found.append((max(limit - used, 0), f"the cgroup's memory limit ({limit / 2**30:.3g} GiB)"))
            break
    return found


def available(device: str = "cpu") -> tuple[int, str]:
    """The smallest of `limits`: (bytes, what sets it)."""
    return min(limits(device))


def beyond_memory(need: int, device: str) -> str | None:
    """'needs about X GiB of memory, more than the Y GiB left under Z' when `need` bytes exceed the binding limit,
    else None."""
    have, what = available(device)
    if need <= have:
        return None
    return f"needs about {need / 2**30:.3g} GiB of memory, more than the {have / 2**30:.3g} GiB left under {what}"


ASKED = re.compile(r"(?:tried to allocate|allocate) (\d+(?:\.\d+)?) ?(bytes|[KMGT]iB|B)?")
UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def allocation_failure(err: BaseException) -> str | None:
    """'X GiB asked for, Y GiB left under Z' when `err` is an allocator's failure (torch's CPU or CUDA allocator,
    Python's MemoryError), else None."""
    import torch

    text = str(err)
    if not (isinstance(err, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in text
            or "DefaultCPUAllocator" in text):
        return None
    match = ASKED.search(text)
    asked = (f"{float(match.group(1)) * UNITS.get(match.group(2) or 'bytes', 1) / 2**30:.3g} GiB asked for"
             if match else "an allocation failed")
    device = "cuda" if isinstance(err, torch.OutOfMemoryError) else "cpu"
    have, what = available(device)
    return f"{asked}, {have / 2**30:.3g} GiB left under {what}"
