"""Import a script that is not in a package (a bench, an example) as a module for a test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(name: str, path: Path) -> ModuleType:
    """The module of the Python file at ``path``, registered as ``name`` (dataclasses and
    pickling look a class's module up in ``sys.modules`` while it is being defined)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"not a Python file: {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
