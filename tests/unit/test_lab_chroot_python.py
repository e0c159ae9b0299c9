"""A site user's Python inside a Slurm chroot lab (slurmgpu/lab/chroot_python.py).

The lab is a stand-in with the two things the function uses (``chroot.inside`` and
``share``); the real binds are exercised by the release tests (tests/slurm, on a chroot).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from slurmgpu.lab.chroot_python import (
    CHROOT_PATH,
    ChrootPythonError,
    chroot_python,
    stdlib_of,
)

PYTHON = Path(sys.executable)


@dataclass
class _Chroot:
    path: Path

    def inside(self, path: Path | str) -> Path:
        return self.path / str(path).lstrip("/")


@dataclass
class _Lab:
    root: Path
    chroot: _Chroot | None
    shared: list[Path] = field(default_factory=list)

    def share(self, *dirs: Path) -> None:
        self.shared.extend(dirs)


def test_the_copy_is_bound_in_with_its_library_packages_and_checkout(tmp_path: Path) -> None:
    lab = _Lab(tmp_path / "lab", _Chroot(tmp_path / "chroot"))
    work, checkout = tmp_path / "work", tmp_path / "checkout"
    argv, env = chroot_python(cast(Any, lab), PYTHON, work, checkout)
    copy = Path(argv[0])
    assert copy.parent == work / "python" and copy.is_file()
    assert copy.read_bytes() == PYTHON.resolve().read_bytes()
    stdlib = stdlib_of(PYTHON)
    assert lab.shared[0] == stdlib and lab.shared[2:] == [checkout, work]
    assert env["PATH"] == CHROOT_PATH
    assert env["PYTHONHOME"] == str(stdlib.parents[1])
    assert env["PYTHONPATH"].split(":")[0] == str(checkout)


def test_a_chroot_with_its_own_python_there_or_no_chroot_is_one_clear_error(
    tmp_path: Path,
) -> None:
    root = tmp_path / "chroot"
    lab = _Lab(tmp_path / "lab", _Chroot(root))
    _Chroot(root).inside(stdlib_of(PYTHON)).mkdir(parents=True)  # not a bind
    with pytest.raises(ChrootPythonError, match="has a Python of its own"):
        chroot_python(cast(Any, lab), PYTHON, tmp_path / "work", tmp_path)
    assert lab.shared == []  # nothing bound
    with pytest.raises(ChrootPythonError, match="does not run from a chroot"):
        chroot_python(cast(Any, _Lab(tmp_path, None)), PYTHON, tmp_path / "w", tmp_path)
    with pytest.raises(ChrootPythonError, match="cannot tell its standard library"):
        stdlib_of(tmp_path / "no-such-python")
