"""Pick the SlurmClient backend: pyslurm when it matches the running Slurm, else the CLI.

pyslurm is a C-API binding built for one Slurm release line; loaded against another it
misbehaves, so ``auto`` uses it only when its ``major.minor`` equals the running
Slurm's (from ``sinfo --version``). ``prefer="cli"`` / ``"pyslurm"`` force a backend.
The version probes and the pyslurm constructor are parameters, so the decision can be
tested without pyslurm installed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Literal

from slurmgpu.slurm.cli import DEFAULT_TIMEOUT_S, CliSlurmClient
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.slurm.pyslurm import PySlurmClient, PySlurmUnavailableError, import_pyslurm

__all__ = [
    "BACKENDS",
    "choose_backend",
    "installed_pyslurm_version",
    "major_minor",
    "select_backend",
]

log = logging.getLogger("slurmgpu.slurm")

BACKENDS = ("auto", "cli", "pyslurm")
Backend = Literal["cli", "pyslurm"]


def major_minor(version: str | None) -> tuple[int, int] | None:
    """``"23.11.4"`` / ``"slurm 23.11.4"`` / ``"23.11"`` → ``(23, 11)``; else None."""
    if not version:
        return None
    m = re.search(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def installed_pyslurm_version() -> str | None:
    """pyslurm's version (``"25.11.0"``), or None when it does not import."""
    try:
        module = import_pyslurm()
    except PySlurmUnavailableError as exc:
        log.debug("%s", exc)
        return None
    v = getattr(module, "__version__", None)
    if not isinstance(v, str):
        fn = getattr(module, "version", None)
        v = fn() if callable(fn) else None
    return v if isinstance(v, str) else "unknown"


def choose_backend(prefer: str, pyslurm_version: str | None, slurm_version: str | None) -> Backend:
    """The decision alone: which backend for these versions.

    Raises ``ValueError`` for an unknown ``prefer`` and :class:`SlurmError` when
    ``prefer="pyslurm"`` but pyslurm is not importable.
    """
    if prefer not in BACKENDS:
        raise ValueError(f"unknown Slurm backend {prefer!r}; choose one of {', '.join(BACKENDS)}")
    if prefer == "cli":
        return "cli"
    if prefer == "pyslurm":
        if pyslurm_version is None:
            raise SlurmError(
                "backend 'pyslurm' was asked for but pyslurm is not installed "
                "(pip install 'slurmgpu[pyslurm]', built for this Slurm) - or use 'cli'"
            )
        want, have = major_minor(slurm_version), major_minor(pyslurm_version)
        if want is not None and have != want:
            log.warning(
                "pyslurm %s does not match Slurm %s; using it because it was asked for",
                pyslurm_version,
                slurm_version,
            )
        return "pyslurm"
    # auto
    if pyslurm_version is None:
        return "cli"
    want, have = major_minor(slurm_version), major_minor(pyslurm_version)
    if want is None or have != want:
        log.info(
            "not using pyslurm %s with Slurm %s (major.minor differ or unknown); using the CLI",
            pyslurm_version,
            slurm_version or "unknown",
        )
        return "cli"
    return "pyslurm"


def select_backend(
    prefer: str = "auto",
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    slurm_conf: str | None = None,
    pyslurm_version: Callable[[], str | None] = installed_pyslurm_version,
    slurm_version: Callable[[], str | None] | None = None,
    pyslurm_factory: Callable[[], SlurmClient] | None = None,
) -> SlurmClient:
    """Return the SlurmClient to use (see the module docstring).

    ``slurm_version`` defaults to the CLI's ``sinfo --version`` (None when that fails);
    ``pyslurm_factory`` to ``PySlurmClient(timeout_s=..., slurm_conf=...)``.
    """
    cli = CliSlurmClient(timeout_s=timeout_s, slurm_conf=slurm_conf)
    if prefer == "cli":
        choose_backend(prefer, None, None)
        return cli

    def running_version() -> str | None:
        try:
            return cli.version()
        except SlurmError as exc:
            log.info("cannot tell the Slurm version: %s", exc)
            return None

    py_v = pyslurm_version()
    if prefer == "auto" and py_v is None:
        return cli  # no need to ask Slurm for its version
    slurm_v = (slurm_version or running_version)()
    if choose_backend(prefer, py_v, slurm_v) == "cli":
        return cli
    if pyslurm_factory is not None:
        return pyslurm_factory()
    return PySlurmClient(timeout_s=timeout_s, slurm_conf=slurm_conf)
