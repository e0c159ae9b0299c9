"""``checkpoint-<step>`` directories marked complete: the layout the Hugging Face and the
Accelerate integrations share.

A framework saves a step's checkpoint into ``checkpoint-<step>/`` (every rank writing its
part); once every rank is done, rank 0 writes the mark, ``sgpu-elastic.json`` (the step,
the world size and the devices it was saved at). A directory without the mark is a save
killed half-way and is never resumed from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_DIR", "CHECKPOINT_MARK", "cuda_devices", "newest_marked", "read_mark"]

CHECKPOINT_MARK = "sgpu-elastic.json"  # in a checkpoint-<step>/ directory: it is complete
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


def read_mark(checkpoint: str | Path) -> dict[str, Any] | None:
    """A checkpoint's ``sgpu-elastic.json`` (None when absent or unreadable)."""
    try:
        doc = json.loads((Path(checkpoint) / CHECKPOINT_MARK).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _marked(path: Path) -> bool:
    return read_mark(path) is not None


def newest_marked(directory: str | Path, complete: Callable[[Path], bool] = _marked) -> Path | None:
    """The newest ``checkpoint-<step>`` under ``directory`` that ``complete`` accepts (by
    default: it carries a readable mark); None when there is none (start fresh)."""
    base = Path(directory)
    if not base.is_dir():
        return None
    found: list[tuple[int, Path]] = []
    for entry in base.iterdir():
        match = CHECKPOINT_DIR.match(entry.name)
        if match and entry.is_dir() and complete(entry):
            found.append((int(match.group(1)), entry))
    return max(found)[1] if found else None


def cuda_devices() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
