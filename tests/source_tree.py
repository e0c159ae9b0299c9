"""The project's own Python sources, read and parsed once per test process.

Several unit tests scan the code itself (layers, Slurm syntax, sbatch options, SQL,
subprocess use, Slurm clients): each used to read and parse every file again, about
0.4 s of CPU per scan and per xdist worker. Files are keyed by path; a test that wants
a tree it may change must copy it (``copy.deepcopy``), since every caller shares it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["ROOT", "parsed", "python_files", "source"]

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def python_files(top: str) -> tuple[Path, ...]:
    """Every ``*.py`` under ``ROOT / top`` (``slurmgpu``, ``tests``, ``bench``), sorted."""
    return tuple(sorted((ROOT / top).rglob("*.py")))


@functools.cache
def source(path: Path) -> str:
    """The text of ``path`` (UTF-8)."""
    return path.read_text(encoding="utf-8")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of ``path``: shared, never to be changed by a caller."""
    return ast.parse(source(path), str(path))
