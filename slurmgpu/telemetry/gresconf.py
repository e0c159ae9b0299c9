"""The GPU lines of a node's gres.conf: Slurm device index → device file and minor number.

Slurm numbers a node's GPUs 0, 1, … in the order its gres.conf lists their device files,
and that index is what ``CUDA_VISIBLE_DEVICES`` (without ConstrainDevices), ``SLURM_JOB_GPUS``
and squeue's ``gres_detail`` ``IDX`` report. The device minor (the N of ``/dev/nvidiaN``) is
what NVML's ``nvmlDeviceGetMinorNumber`` returns, and it is *not* always the NVML ordinal,
so the minor is the key that links Slurm's index to a probed device.

>>> [(d.index, d.path, d.minor) for d in parse_gres_conf(
...     "NodeName=gpu[1-4] Name=gpu File=/dev/tty[0-3]", "gpu2")][:2]
[(0, '/dev/tty0', 0), (1, '/dev/tty1', 1)]
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

_TRAILING_NUMBER = re.compile(r"(\d+)$")


class GresConfError(ValueError):
    """A gres.conf GPU line that cannot be understood (message names the line)."""


@dataclass(frozen=True, slots=True)
class GresGpuDevice:
    """One GPU of one node as gres.conf declares it."""

    index: int  # Slurm device index on the node
    path: str | None  # device file, e.g. /dev/nvidia3; None for Count=-only lines
    minor: int | None  # number at the end of the device file name
    gpu_type: str | None = None


def _expand(pattern: str) -> list[str]:
    try:
        return list(NodeSet(pattern))
    except NodeSetParseError as exc:
        raise GresConfError(f"cannot expand {pattern!r}: {exc}") from None


def _fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in shlex.split(line, comments=False, posix=True):
        key, sep, value = token.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def _node_lines(text: str, node: str, name: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, fields) of each ``Name=<name>`` line of gres.conf that applies to ``node`` (no
    ``NodeName=``, or one naming it); comments, blanks and ``Include`` lines skipped."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.lower().startswith("include"):
            continue
        try:
            fields = _fields(line)
        except ValueError as exc:
            raise GresConfError(f"gres.conf line {lineno}: {exc}") from None
        if fields.get("name", "").lower() != name:
            continue
        node_names = fields.get("nodename")
        if node_names is not None and node not in _expand(node_names):
            continue
        yield lineno, fields


def parse_gres_conf(text: str, node: str) -> list[GresGpuDevice]:
    """Return ``node``'s GPUs (``Name=gpu`` lines) in Slurm index order.

    Lines without ``NodeName=`` apply to every node (a node-local gres.conf). ``Name=shard``
    and ``Name=mps`` lines are not devices and are skipped; so are ``AutoDetect=`` and
    ``Include`` lines. A ``Count=N`` line without ``File=`` declares N GPUs whose device
    files Slurm does not know (minor None). File ranges expand with ClusterShell's NodeSet
    (``/dev/nvidia[0-3]``), which orders them numerically.
    """
    devices: list[GresGpuDevice] = []
    for lineno, fields in _node_lines(text, node, "gpu"):
        gpu_type = fields.get("type") or None
        multiple = fields.get("multiplefiles")
        if multiple:
            # One GPU backed by several device files (e.g. AMD): the first names it.
            paths = _expand(multiple)
            m = _TRAILING_NUMBER.search(paths[0]) if paths else None
            devices.append(
                GresGpuDevice(
                    index=len(devices),
                    path=paths[0] if paths else None,
                    minor=int(m.group(1)) if m else None,
                    gpu_type=gpu_type,
                )
            )
            continue
        files = fields.get("file")
        if files:
            for path in _expand(files):
                m = _TRAILING_NUMBER.search(path)
                devices.append(
                    GresGpuDevice(
                        index=len(devices),
                        path=path,
                        minor=int(m.group(1)) if m else None,
                        gpu_type=gpu_type,
                    )
                )
            continue
        count_text = fields.get("count", "0")
        try:
            count = int(count_text)
        except ValueError:
            raise GresConfError(
                f"gres.conf line {lineno}: Count={count_text!r} is not a number"
            ) from None
        for _ in range(count):
            devices.append(
                GresGpuDevice(index=len(devices), path=None, minor=None, gpu_type=gpu_type)
            )
    return devices


def mps_minors(text: str, node: str) -> set[int]:
    """Return the minors of ``node``'s GPUs that a ``Name=mps`` line shares with MPS.

    ``Name=mps Count=100 File=/dev/nvidia0`` offers 100 % of /dev/nvidia0's SMs to MPS
    clients; an ``mps`` line without ``File=`` names no device and adds nothing.
    """
    minors: set[int] = set()
    for _lineno, fields in _node_lines(text, node, "mps"):
        for path in _expand(fields["file"]) if fields.get("file") else []:
            m = _TRAILING_NUMBER.search(path)
            if m:
                minors.add(int(m.group(1)))
    return minors


def read_gres_conf(path: Path, node: str) -> list[GresGpuDevice]:
    """Return ``node``'s GPUs from the gres.conf at ``path`` (see ``parse_gres_conf``)."""
    return parse_gres_conf(path.read_text(), node)


def minors_by_index(devices: list[GresGpuDevice]) -> dict[int, int]:
    """Return Slurm index → device minor for the devices whose minor is known."""
    return {d.index: d.minor for d in devices if d.minor is not None}
