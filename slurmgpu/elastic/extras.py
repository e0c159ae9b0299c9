"""Optional frameworks the elastic helpers import only when a job uses them."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["require"]


def require(module: str, extra: str, user: str) -> Any:
    """Return ``module`` imported, or raise RuntimeError naming the extra that installs it
    (``user`` is the slurmgpu module that needs it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised only without the framework
        raise RuntimeError(f"{user} needs {module} (pip install 'slurmgpu[{extra}]')") from exc
