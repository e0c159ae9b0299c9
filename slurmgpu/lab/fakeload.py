"""The fake GPU load program: declares utilization and memory for the simulated probe.

``run_fakeload`` writes one declaration per device it was given (see ``simgpu``) for its
own pid, refreshes them every ``interval_s`` with the values its pattern prescribes, and
removes them when it finishes, on SIGTERM, and on Ctrl-C. A SIGKILLed run leaves files
behind that the probe drops (dead pid) and removes.

Which devices: ``devices_from_environ`` reads what Slurm set for the step. The assumption
(true for the lab cluster's fake GPUs and for any site without ``ConstrainDevices=yes``) is
that ``CUDA_VISIBLE_DEVICES`` holds *Slurm device indices* of the node. With
ConstrainDevices, Slurm renumbers ``CUDA_VISIBLE_DEVICES`` from 0 inside the device cgroup
while ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` keep the global indices; when the visible list
is not a subset of those, it is read as positions in them. ``--devices`` overrides all.

Patterns (``parse_pattern``):

- ``constant``: the given util and memory throughout;
- ``idle-after:60s``: util drops to 0 after 60 s (memory stays allocated, as a real idle
  job's would);
- ``bursty`` / ``bursty:10s``: alternating busy (util) and idle (0) phases whose lengths
  are drawn uniformly from [0.5, 1.5] times the period by a seeded generator, busy first;
- ``mem-growth`` / ``mem-growth:5m``: memory grows linearly from ``memory_mib`` to
  ``mem_max_mib`` over the ramp (default: the whole duration, or 60 s when unbounded).
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

from slurmgpu.stop_flag import StopFlag
from slurmgpu.telemetry.simgpu import LoadDeclaration, remove_declaration, write_declaration
from slurmgpu.units import parse_duration

PatternKind = Literal["constant", "idle-after", "bursty", "mem-growth"]

_UNBOUNDED = {"inf", "infinite", "unlimited", "forever", "none"}
DEFAULT_BURST_PERIOD_S = 10.0
DEFAULT_RAMP_S = 60.0


class FakeloadError(ValueError):
    """A fakeload request that cannot run; the message says what to change."""


def parse_duration_s(text: str) -> float | None:
    """Return seconds for ``"60s"``, ``"5m"``, ``"1h30m"``; None for ``"inf"`` (no limit)."""
    if text.strip().lower() in _UNBOUNDED:
        return None
    return parse_duration(text).total_seconds()


@dataclass(frozen=True, slots=True)
class LoadPattern:
    """How declared util and memory change over a run (see the module docstring)."""

    kind: PatternKind = "constant"
    after_s: float | None = None  # idle-after: when util drops to 0
    period_s: float = DEFAULT_BURST_PERIOD_S  # bursty: mean phase length
    ramp_s: float | None = None  # mem-growth: time to reach the cap (None: default)


def parse_pattern(text: str) -> LoadPattern:
    """Return the pattern of ``"constant"``, ``"idle-after:60s"``, ``"bursty[:10s]"``,
    ``"mem-growth[:5m]"``.

    >>> parse_pattern("idle-after:90s")
    LoadPattern(kind='idle-after', after_s=90.0, period_s=10.0, ramp_s=None)
    """
    name, _, arg = text.strip().partition(":")
    name = name.strip().lower()
    arg = arg.strip()

    def seconds(what: str) -> float:
        try:
            value = parse_duration(arg).total_seconds()
        except ValueError:
            raise ValueError(f'pattern {text!r}: {what} must be a duration like "60s"') from None
        return value

    if name == "constant" and not arg:
        return LoadPattern("constant")
    if name == "idle-after":
        if not arg:
            raise ValueError(f'pattern {text!r}: say when, e.g. "idle-after:60s"')
        return LoadPattern("idle-after", after_s=seconds("the idle time"))
    if name == "bursty":
        period = seconds("the period") if arg else DEFAULT_BURST_PERIOD_S
        if period <= 0:
            raise ValueError(f"pattern {text!r}: the period must be positive")
        return LoadPattern("bursty", period_s=period)
    if name == "mem-growth":
        ramp = seconds("the ramp") if arg else None
        if ramp is not None and ramp <= 0:
            raise ValueError(f"pattern {text!r}: the ramp must be positive")
        return LoadPattern("mem-growth", ramp_s=ramp)
    raise ValueError(
        f'unknown pattern {text!r}: use "constant", "idle-after:60s", "bursty[:10s]" '
        'or "mem-growth[:5m]"'
    )


class LoadSchedule:
    """The (util %, memory MiB) a run declares ``elapsed_s`` seconds after its start."""

    def __init__(
        self,
        pattern: LoadPattern,
        util_pct: float,
        memory_mib: int,
        *,
        mem_max_mib: int | None = None,
        duration_s: float | None = None,
        seed: int = 0,
    ) -> None:
        if not 0 <= util_pct <= 100:
            raise FakeloadError(f"util must be between 0 and 100 %, not {util_pct}")
        if memory_mib < 0:
            raise FakeloadError("memory must not be negative")
        if pattern.kind == "mem-growth":
            if mem_max_mib is None:
                raise FakeloadError("the mem-growth pattern needs a cap: pass --mem-max")
            if mem_max_mib < memory_mib:
                raise FakeloadError("--mem-max must be at least --mem")
        self.pattern = pattern
        self.util_pct = float(util_pct)
        self.memory_mib = memory_mib
        self.mem_max_mib = mem_max_mib if mem_max_mib is not None else memory_mib
        self.ramp_s = pattern.ramp_s or duration_s or DEFAULT_RAMP_S
        self._rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
        self._phase_ends: list[float] = []  # end of busy, end of idle, end of busy, ...

    def _busy_at(self, elapsed_s: float) -> bool:
        while not self._phase_ends or self._phase_ends[-1] <= elapsed_s:
            start = self._phase_ends[-1] if self._phase_ends else 0.0
            length = self.pattern.period_s * self._rng.uniform(0.5, 1.5)
            self._phase_ends.append(start + length)
        return bisect.bisect_right(self._phase_ends, elapsed_s) % 2 == 0

    def at(self, elapsed_s: float) -> tuple[float, int]:
        kind = self.pattern.kind
        util, memory = self.util_pct, self.memory_mib
        idle_now = kind == "idle-after" and elapsed_s >= (self.pattern.after_s or 0.0)
        if idle_now or (kind == "bursty" and not self._busy_at(elapsed_s)):
            util = 0.0
        elif kind == "mem-growth":
            fraction = min(1.0, max(0.0, elapsed_s / self.ramp_s))
            memory = round(self.memory_mib + (self.mem_max_mib - self.memory_mib) * fraction)
        return util, memory


def _int_list(value: str | None) -> list[int]:
    if not value:
        return []
    parts = (part.strip() for part in value.split(","))
    return [int(part) for part in parts if part.isdigit()]


def devices_from_environ(environ: Mapping[str, str]) -> tuple[int, ...]:
    """Return the Slurm device indices this process may use (see the module docstring)."""
    visible = _int_list(environ.get("CUDA_VISIBLE_DEVICES"))
    global_ids = _int_list(environ.get("SLURM_STEP_GPUS")) or _int_list(
        environ.get("SLURM_JOB_GPUS")
    )
    if not visible:
        return tuple(global_ids)
    if global_ids and not set(visible) <= set(global_ids):
        ordered = sorted(global_ids)
        return tuple(ordered[i] for i in visible if i < len(ordered))
    return tuple(visible)


def job_id_from_env(environ: Mapping[str, str]) -> int | None:
    value = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    return int(value) if value and value.isdigit() else None


def node_from_env(environ: Mapping[str, str]) -> str:
    """Return ``$SLURMD_NODENAME`` (the Slurm node name), else the short host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class FakeloadOutcome(enum.StrEnum):
    COMPLETED = "completed"  # ran for the whole duration
    STOPPED = "stopped"  # SIGTERM or the stop event


def run_fakeload(
    util_pct: float,
    memory_mib: int,
    pattern: LoadPattern | str,
    duration_s: float | None,
    state_dir: Path,
    node: str | None,
    interval_s: float,
    *,
    devices: Sequence[int] | None = None,
    job_id: int | None = None,
    mem_max_mib: int | None = None,
    seed: int = 0,
    environ: Mapping[str, str] | None = None,
    stop: threading.Event | StopFlag | None = None,
) -> FakeloadOutcome:
    """Declare the load until ``duration_s`` passes (None: until stopped); then clean up.

    ``devices``, ``job_id`` and ``node`` default to what ``environ`` (default
    ``os.environ``) says. SIGTERM sets ``stop`` when called from the main thread.
    """
    env = os.environ if environ is None else environ
    if isinstance(pattern, str):
        try:
            pattern = parse_pattern(pattern)
        except ValueError as exc:
            raise FakeloadError(str(exc)) from None
    if interval_s <= 0:
        raise FakeloadError("the refresh interval must be positive")
    chosen = tuple(devices) if devices is not None else devices_from_environ(env)
    if not chosen:
        raise FakeloadError(
            "no GPU to load: CUDA_VISIBLE_DEVICES is unset or empty (run inside a job "
            "with --gres=gpu:N or --gres=shard:N, or pass --devices 0,1)"
        )
    schedule = LoadSchedule(
        pattern, util_pct, memory_mib, mem_max_mib=mem_max_mib, duration_s=duration_s, seed=seed
    )
    node_name = node or node_from_env(env)
    job = job_id if job_id is not None else job_id_from_env(env)
    pid = os.getpid()
    stop_event = stop if stop is not None else StopFlag()  # set by a signal handler

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    if in_main:

        def _on_term(signum: int, frame: FrameType | None) -> None:
            stop_event.set()

        signal.signal(signal.SIGTERM, _on_term)
    started = time.monotonic()
    try:
        while not stop_event.is_set():
            elapsed = time.monotonic() - started
            if duration_s is not None and elapsed >= duration_s:
                return FakeloadOutcome.COMPLETED
            util, memory = schedule.at(elapsed)
            now = time.time()
            for device in chosen:
                write_declaration(
                    state_dir,
                    node_name,
                    LoadDeclaration(
                        pid=pid,
                        device=device,
                        util_pct=util,
                        memory_mib=memory,
                        job_id=job,
                        updated_at=now,
                        interval_s=interval_s,
                    ),
                )
            wait_s = interval_s
            if duration_s is not None:
                wait_s = min(wait_s, max(0.0, duration_s - elapsed))
            stop_event.wait(wait_s)
        return FakeloadOutcome.STOPPED
    finally:
        for device in chosen:
            with contextlib.suppress(OSError):
                remove_declaration(state_dir, node_name, pid, device)
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
