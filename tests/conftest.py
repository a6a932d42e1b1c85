"""Tests run offline: no hub access, fixed seeds, few threads."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")
