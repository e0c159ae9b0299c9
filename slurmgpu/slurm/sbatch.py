"""sbatch's options, written from typed requests: the one place slurmgpu spells them.

``sgpu eff``'s advice, the alert emails' suggestions and ``sgpu submit``'s additions to a
malleable job's sbatch command line all come from here, so they cannot drift apart (before
issue 37 each wrote its own ``f"--gpus={k}"``; ``tests/unit/test_sbatch_options_home.py``
keeps it that way). Each function takes typed numbers (counts, MiB, a ``timedelta``, a
signal name) and returns :class:`SbatchOptions`: the argument words for an argv, and, as
``str()``, the text a user types after ``sbatch`` (or on an ``#SBATCH`` line). A request
sbatch would refuse or read differently (no GPUs, ``--mem=0``, which means a node's whole
memory, a grace sbatch cannot carry) raises ValueError instead of being written.

The time limit is :func:`slurmgpu.units.format_time_limit` (``D-HH:MM:SS``, the one
formatter: the pure policies word their reasons with it too, and policy/ may not import
slurm/); memory is whole MiB, written in ``G`` when it is whole GiB, else in ``M``, never
rounded to a rounder figure.

>>> str(gpus(2)), str(gpus(1, nodes=1)), str(shards(4)), str(cpus_per_task(3))
('--gpus=2', '--nodes=1 --gpus=1', '--gres=shard:4', '-c 3')
>>> str(mem(10240)), str(mem(9984)), str(time_limit(timedelta(days=2, minutes=5)))
('--mem=10G', '--mem=9984M', '--time=2-00:05:00')
>>> checkpoint_signal("USR2", 120).argv
('--signal=B:USR2@120',)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from slurmgpu.checkpoint_signal import CATCHABLE, MAX_GRACE_S, MIN_GRACE_S
from slurmgpu.units import format_time_limit

__all__ = [
    "SbatchOptions",
    "checkpoint_signal",
    "cpus_per_task",
    "gpus",
    "gres",
    "gres_gpus",
    "mem",
    "mem_size",
    "shards",
    "time_limit",
]


@dataclass(frozen=True, slots=True)
class SbatchOptions:
    """sbatch options as argument words (``argv``); ``str()`` joins them the way a user
    types them (``--nodes=1 --gpus=2``)."""

    argv: tuple[str, ...]

    def __str__(self) -> str:
        return " ".join(self.argv)


def _whole(what: str, value: int, least: int = 1) -> int:
    # bool is an int to Python, never a count to sbatch
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} must be a whole number of at least {least}, not {value!r}")
    return value


def gpus(count: int, *, nodes: int | None = None) -> SbatchOptions:
    """``--gpus=COUNT`` (GPUs for the whole job), after ``--nodes=NODES`` when given."""
    words: tuple[str, ...] = (f"--gpus={_whole('GPUs', count)}",)
    if nodes is not None:
        words = (f"--nodes={_whole('nodes', nodes)}", *words)
    return SbatchOptions(words)


def gres_gpus(count: int) -> SbatchOptions:
    """``--gres=gpu:COUNT``: GPUs on each node of the job (Slurm's per-node form)."""
    return SbatchOptions((f"--gres=gpu:{_whole('GPUs', count)}",))


def shards(count: int) -> SbatchOptions:
    """``--gres=shard:COUNT``: a share of one GPU (Slurm's shard GRES)."""
    return SbatchOptions((f"--gres=shard:{_whole('shards', count)}",))


def gres(spec: str) -> SbatchOptions:
    """``--gres=SPEC`` for one share of a GPU: ``gpu:1g.10gb:1`` (a MIG slice),
    ``mps:25``, ``shard:4``."""
    if not spec or any(ch.isspace() for ch in spec) or spec.count(":") not in (1, 2):
        raise ValueError(f"not a GRES request: {spec!r}")
    return SbatchOptions((f"--gres={spec}",))


def cpus_per_task(count: int) -> SbatchOptions:
    """``-c COUNT`` (``--cpus-per-task``), the spelling users know from sbatch's examples."""
    return SbatchOptions(("-c", str(_whole("CPUs per task", count))))


def mem_size(mib: int) -> str:
    """Memory as ``--mem`` takes it: ``G`` for whole GiB, else ``M``; never a rounder
    figure than asked for (the advice names what rightsizing sets). At least 1 MiB:
    ``--mem=0`` asks for a node's whole memory.

    >>> mem_size(6144), mem_size(2560), mem_size(1)
    ('6G', '2560M', '1M')
    """
    value = _whole("memory (MiB)", mib)
    return f"{value // 1024}G" if value % 1024 == 0 else f"{value}M"


def mem(mib: int) -> SbatchOptions:
    """``--mem=SIZE``: memory per node (:func:`mem_size`)."""
    return SbatchOptions((f"--mem={mem_size(mib)}",))


def time_limit(limit: timedelta) -> SbatchOptions:
    """``--time=[D-]HH:MM:SS`` (:func:`slurmgpu.units.format_time_limit`; a fraction of a
    second rounds up, a limit is never shortened). A limit under one second is refused:
    ``--time=0`` means no limit to sbatch."""
    if not isinstance(limit, timedelta) or limit <= timedelta(0):
        raise ValueError(f"a time limit must be a positive timedelta, not {limit!r}")
    return SbatchOptions((f"--time={format_time_limit(limit)}",))


def checkpoint_signal(signal: str, grace_s: int) -> SbatchOptions:
    """``--signal=B:SIGNAL@GRACE``: Slurm sends the catchable ``signal`` (its name without
    ``SIG``, as :func:`slurmgpu.checkpoint_signal.checkpoint_signal` gives it) to the batch
    shell ``grace_s`` seconds before the time limit: 1 to 65535, what sbatch carries and
    the ``sgpu:ckpt`` token takes."""
    if signal not in CATCHABLE:
        raise ValueError(f"{signal[:20]!r} is not the name of a catchable signal like USR2")
    grace = _whole("the checkpoint grace (s)", grace_s, MIN_GRACE_S)
    if grace > MAX_GRACE_S:
        raise ValueError(f"the checkpoint grace must be at most {MAX_GRACE_S} s, not {grace}")
    return SbatchOptions((f"--signal=B:{signal}@{grace}",))
