"""The runtime inside a malleable job: who am I, was I asked to checkpoint, where is my state.

::

    from slurmgpu import elastic

    run = elastic.init()                  # reads the environment, installs the handlers
    state = run.resume(default=fresh)     # the last checkpoint, or ``fresh``
    while state.step < total:
        train_one_step(state, gpus=run.gpus)
        run.step_done(samples=batch)      # throughput at this GPU count, for the policy
        if run.checkpoint_requested:
            run.checkpoint(state)         # answers the request, then waits to be requeued

**Signals.** The checkpoint signal (``SGPU_CHECKPOINT_SIGNAL``, default ``USR2``; the
daemon sends it before a resize and Slurm sends it ``--signal`` seconds before the time
limit) and ``SIGTERM`` (preemption, requeue, scancel) only set flags; the training loop
acts on them between steps, never inside a handler. ``SIGTERM`` also sets ``stop_requested``.

**Answering a request.** ``checkpoint(state)`` writes the state atomically, then (when a
request is pending) ``ack.json``, then waits up to ``SGPU_CHECKPOINT_HOLD`` seconds
(default 300) without training: the daemon requeues the job now, and the ``SIGTERM`` of
that requeue ends the wait with a clean exit, so no step runs after the checkpoint that
would be lost. If nobody requeues the job (the daemon aborted the resize), training goes
on from exactly where it was. The exit is ``os._exit(0)`` after flushing stdout/stderr
(:func:`hard_exit`): the checkpoint is durable by then, and the interpreter's teardown
with torch loaded takes seconds during which the GPUs are held by nobody.

**Ranks.** Only rank 0 (``RANK``, else ``SLURM_PROCID``) writes the checkpoint and the
acknowledgement; other ranks' ``checkpoint()`` is a no-op that waits the same way, so
they do not exit early. A torch job should agree on the flag across ranks first
(:func:`slurmgpu.elastic.torch.agree`).

**Where.** Files live in ``<state dir>/<job id>/``; the state dir is
``SGPU_ELASTIC_DIR`` (``sgpu submit --malleable`` sets it) or
``$SLURM_SUBMIT_DIR/.sgpu-elastic``. Outside Slurm (a laptop run) the job id is 0 and the
directory is ``./.sgpu-elastic``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from slurmgpu.checkpoint_signal import checkpoint_signal_number
from slurmgpu.elastic.checkpoint import load_pickle, write_atomic, write_pickle
from slurmgpu.elastic.spec import (
    ACK_FILE,
    DEFAULT_DIR_NAME,
    PROGRESS_FILE,
    Ack,
    job_dir,
    read_ack,
)

__all__ = ["CHECKPOINT_FILE", "CHECKPOINT_FILES", "ElasticRun", "hard_exit", "init"]

CHECKPOINT_FILE = "checkpoint.pkl"
# Every checkpoint a run may have written: this module's pickle and
# slurmgpu.elastic.torch's torch.save file.
CHECKPOINT_FILES = (CHECKPOINT_FILE, "checkpoint.pt")
DEFAULT_HOLD_S = 300.0
PROGRESS_EVERY_S = 5.0
AWAIT_SLICE_S = 0.05  # how often the hold after an acknowledgement looks at its flags
RATE_WINDOW_S = 0.5  # throughput is measured over windows at least this long


def _env_int(env: Mapping[str, str], *names: str, default: int = 0) -> int:
    for name in names:
        text = env.get(name, "").strip()
        if text.lstrip("-").isdigit():
            return int(text)
    return default


def _count_devices(env: Mapping[str, str]) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES, else Slurm's GPU variables."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = _env_int(env, "SLURM_GPUS_ON_NODE", default=-1)
    if gpus >= 0:
        return gpus
    job_gpus = env.get("SLURM_JOB_GPUS", "")
    return len([d for d in job_gpus.split(",") if d.strip()])


def hard_exit(code: int = 0) -> None:
    """Flush stdout/stderr and leave at once (``os._exit``).

    The checkpoint is durable when this is called, so nothing is left to save: skipping
    the interpreter's teardown (atexit hooks, finalising every torch module, joining
    threads) takes a torch process from ~10 s to well under one before it frees the GPUs.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _signal_number(name: str) -> signal.Signals:
    """The checkpoint signal ``name`` names (:mod:`slurmgpu.checkpoint_signal`: never
    KILL or STOP); ValueError with a one-line reason naming SGPU_CHECKPOINT_SIGNAL."""
    try:
        return checkpoint_signal_number(name)
    except ValueError as exc:
        raise ValueError(f"SGPU_CHECKPOINT_SIGNAL: {exc}") from None


@dataclass
class ElasticRun:
    """This run of a malleable job (one per process; see :func:`init`)."""

    job_id: int
    restart_count: int
    rank: int
    world_size: int
    gpus: int  # GPUs of the whole job in this run
    local_gpus: int  # GPUs this process sees (CUDA_VISIBLE_DEVICES)
    nodes: int
    state_dir: Path
    checkpoint_signal: signal.Signals = signal.SIGUSR2
    hold_s: float = DEFAULT_HOLD_S
    clock: Callable[[], float] = time.monotonic
    # How the run ends after a durable checkpoint (tests swap in sys.exit).
    exit_process: Callable[[int], None] = hard_exit
    checkpoint_requested: bool = False
    stop_requested: bool = False
    _requests: int = 0  # signals received in this run
    _answered: int = 0
    _acks_before: int = 0  # acks of earlier runs (ack.json's count at start-up)
    _rate_since: float | None = None
    _rate_units: float = 0.0
    _throughput: dict[int, float] = field(default_factory=dict)
    _progress_at: float = 0.0
    _step: int | None = None

    # ------------------------------------------------------------------ identity

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def dir(self) -> Path:
        return job_dir(self.state_dir, self.job_id)

    @property
    def checkpoint_path(self) -> Path:
        return self.dir / CHECKPOINT_FILE

    @property
    def resumed(self) -> bool:
        """A checkpoint of this job exists (this module's or slurmgpu.elastic.torch's)."""
        return any((self.dir / name).exists() for name in CHECKPOINT_FILES)

    # ------------------------------------------------------------------ signals

    def install_handlers(self) -> None:
        """Route the checkpoint signal and SIGTERM to flags (main thread only)."""
        signal.signal(self.checkpoint_signal, self._on_checkpoint_signal)
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_checkpoint_signal(self, signum: int, frame: FrameType | None) -> None:
        # Flags only: a handler that takes a lock (threading.Event.set) deadlocks when it
        # runs while this thread holds that lock, e.g. inside Event.wait, or in a second
        # SIGTERM's handler (torchrun and sgpu launch both send one).
        self._requests += 1
        self.checkpoint_requested = True

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        # Preemption and requeue send only SIGTERM: treat it as "checkpoint now", too.
        self._requests += 1
        self.checkpoint_requested = True
        self.stop_requested = True

    def request_checkpoint(self, *, stop: bool = False) -> None:
        """What the signal handlers do, for callers without signals (tests, notebooks)."""
        (self._on_term if stop else self._on_checkpoint_signal)(0, None)

    # ------------------------------------------------------------------ state

    def resume(self, default: Any = None) -> Any:
        """The newest checkpoint's state, or ``default`` when there is none."""
        if not self.checkpoint_path.exists():
            return default
        return load_pickle(self.checkpoint_path)

    def save(self, state: Any) -> bool:
        """Write a checkpoint without answering anything (periodic saves); rank 0 only."""
        if not self.is_rank0:
            return False
        write_pickle(self.checkpoint_path, state)
        return True

    def checkpoint(self, state: Any, *, step: int | None = None) -> bool:
        """Write ``state``; when a checkpoint was requested, acknowledge and wait.

        Returns True when training may go on (nobody requeued the job within
        ``hold_s``); exits the process (status 0) when SIGTERM arrives after the
        checkpoint, which is how a resize ends this run.
        """
        if step is None:
            step = getattr(state, "step", None) if not isinstance(state, dict) else None
            if step is None and isinstance(state, dict):
                value = state.get("step")
                step = value if isinstance(value, int) else None
        self._step = step if isinstance(step, int) else self._step
        self.save(state)
        return self.acknowledge(step)

    def acknowledge(self, step: int | None = None) -> bool:
        """After a checkpoint was written (by any means): answer a pending request, wait.

        Returns True at once when nothing was requested; see :meth:`checkpoint`.
        """
        if not self.checkpoint_requested:
            return True
        self.checkpoint_requested = False
        self._answered = self._requests
        if self.is_rank0:
            self._write_ack(step)
            self._write_progress(force=True)
        if self.stop_requested:
            self._exit()
        return self._await_requeue()

    def _write_ack(self, step: int | None) -> None:
        previous = read_ack(self.state_dir, self.job_id)
        acks = max(previous.acks if previous else 0, self._acks_before) + 1
        self._acks_before = acks
        ack = Ack(self.job_id, acks, self.restart_count, step, self.gpus, time.time())
        write_atomic(self.dir / ACK_FILE, json.dumps(ack.to_json()).encode(), mode=0o644)

    def _await_requeue(self) -> bool:
        deadline = self.clock() + self.hold_s
        while not self.stop_requested and self.clock() < deadline:
            # A signal interrupts the sleep (its handler runs, then the sleep goes on for
            # at most the rest of this slice): leaving takes at most one slice.
            time.sleep(min(AWAIT_SLICE_S, max(deadline - self.clock(), 0.0)))
        if self.stop_requested:
            self._exit()
        self._rate_since, self._rate_units = None, 0.0  # the wait is not training time
        return True

    def _exit(self) -> None:
        self.exit_process(0)
        raise SystemExit(0)  # only reached when exit_process returns (a test's stand-in)

    # ------------------------------------------------------------------ throughput

    def step_done(self, samples: float = 1.0, *, step: int | None = None) -> None:
        """Count work done since the last call; rank 0 reports throughput every few seconds."""
        now = self.clock()
        if step is not None:
            self._step = step
        if self._rate_since is None:
            self._rate_since = now  # the first step pays start-up costs: start after it
            return
        self._rate_units += samples
        elapsed = now - self._rate_since
        if elapsed >= RATE_WINDOW_S and self._rate_units > 0:
            rate = self._rate_units / elapsed
            old = self._throughput.get(self.gpus)
            self._throughput[self.gpus] = rate if old is None else 0.7 * old + 0.3 * rate
            self._rate_since, self._rate_units = now, 0.0
        if self.is_rank0 and now - self._progress_at >= PROGRESS_EVERY_S:
            self._write_progress()

    def close(self) -> None:
        """At the end of training: write the throughput measured so far (rank 0)."""
        if self.is_rank0:
            self._write_progress()

    def _write_progress(self, *, force: bool = False) -> None:
        if not self._throughput and not force:
            return
        self._progress_at = self.clock()
        path = self.dir / PROGRESS_FILE
        table: dict[str, float] = {}
        try:
            old = json.loads(path.read_text()) if path.exists() else {}
            if isinstance(old, dict) and isinstance(old.get("throughput"), dict):
                table = {
                    str(k): float(v)
                    for k, v in old["throughput"].items()
                    if isinstance(v, int | float)
                }
        except (OSError, ValueError):
            table = {}
        table.update({str(k): round(v, 6) for k, v in self._throughput.items()})
        doc = {"version": 1, "job_id": self.job_id, "throughput": table, "step": self._step}
        write_atomic(path, json.dumps(doc).encode(), mode=0o644)


def init(
    env: Mapping[str, str] | None = None,
    *,
    install_handlers: bool = True,
    state_dir: str | Path | None = None,
) -> ElasticRun:
    """This process's :class:`ElasticRun`, from Slurm's (and torchrun's) environment."""
    e = os.environ if env is None else env
    job_id = _env_int(e, "SLURM_JOB_ID", default=0)  # an array task's own id
    if state_dir is None:
        configured = e.get("SGPU_ELASTIC_DIR", "").strip()
        base = e.get("SLURM_SUBMIT_DIR", "").strip() or os.getcwd()
        state_dir = configured or os.path.join(base, DEFAULT_DIR_NAME)
    hold_text = e.get("SGPU_CHECKPOINT_HOLD", "").strip()
    try:
        hold_s = float(hold_text) if hold_text else DEFAULT_HOLD_S
    except ValueError:
        hold_s = DEFAULT_HOLD_S
    nodes = max(_env_int(e, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1), 1)
    local_gpus = _count_devices(e)
    run = ElasticRun(
        job_id=job_id,
        restart_count=_env_int(e, "SLURM_RESTART_COUNT", default=0),
        rank=_env_int(e, "RANK", "SLURM_PROCID", default=0),
        world_size=max(_env_int(e, "WORLD_SIZE", "SLURM_NTASKS", default=1), 1),
        gpus=local_gpus * nodes,  # Slurm gives every node of a job the same GPU count
        local_gpus=local_gpus,
        nodes=nodes,
        state_dir=Path(state_dir),
        checkpoint_signal=_signal_number(e.get("SGPU_CHECKPOINT_SIGNAL", "USR2") or "USR2"),
        hold_s=max(hold_s, 0.0),
    )
    previous = read_ack(run.state_dir, job_id)
    run._acks_before = previous.acks if previous else 0
    if install_handlers:
        run.install_handlers()
    return run
