"""``sgpu launch -- CMD``: make any training command malleable inside a Slurm job.

The batch script ends with ``exec sgpu launch -- torchrun --nproc-per-node=... train.py``
(or ``srun python train.py``, or plain ``python train.py``). The launcher becomes the
batch shell, starts ``CMD`` and stays its supervisor:

- **Checkpoint signal** (``SGPU_CHECKPOINT_SIGNAL``, default USR2; from the daemon's
  ``scancel --full`` before a resize, or Slurm's ``--signal=B:USR2@grace`` before the time
  limit, which reaches only the batch shell): relayed to every process of the command's
  tree that *catches* it (``SigCgt`` in ``/proc/PID/status``): the training processes that
  called ``slurmgpu.elastic.init()``, or ``srun``, which forwards it to its tasks. Nothing
  else gets it. The command starts with the signal *ignored* (an ignored disposition
  survives ``exec``), so torchrun, a shell or any process that does not handle it is not
  killed by it, whether it comes from the launcher or straight from Slurm; ``init()``
  installs its own handler over the inherited one.
- **At the time limit** (the signal came with less than the grace plus a minute left, by
  ``squeue %L``), the launcher waits up to the grace for the job's acknowledgement (a new
  ``ack.json``, written once the checkpoint is durable) and requeues the job itself
  (``scontrol requeue``): Slurm would otherwise end it TIMEOUT. For a resize the daemon
  does the requeue.
- **Several nodes**: the batch script runs one launcher per node through ``srun``
  inside the batch launcher, ``exec sgpu launch -- srun --ntasks-per-node=1 sgpu launch
  -- torchrun --nnodes=$SLURM_NNODES --rdzv-backend=c10d
  --rdzv-endpoint=$SGPU_HEAD_ADDR:PORT ...`` (``sgpu submit --malleable`` adds the outer
  one to a ``--wrap``). The batch launcher exports ``SGPU_HEAD_ADDR``: the first node's
  ``NodeAddr`` (where torchrun's c10d store listens), ``127.0.0.1`` for a job on one
  node (a job resized by node count runs on one node at times). Neither the time
  limit's signal (``B:``) nor, on 22.05, the daemon's ``scancel --full`` reaches the
  tasks of a step, so the batch launcher of a job with steps (more than one node, or an
  ``srun`` in its tree) sends the checkpoint signal on to them (``scancel --signal=SIG
  JOB``: every step, not the batch shell); each node's launcher relays it to its
  workers. Only the batch launcher requeues at the time limit: a launcher inside a job
  step (``SLURM_STEP_ID`` 0, 1, ...; 26.05 gives the batch script -5) never does, or
  each node would requeue the job once.
- **Shrunk in place**: the daemon shrinks a job on several nodes by ``NumNodes=`` on the
  running job (after the checkpoint's acknowledgement) and sends TERM to its steps. When
  the command then ends, the batch launcher asks Slurm (``squeue``): a job
  still running on fewer nodes than the launcher started it on gets the command again,
  with Slurm's job variables rewritten for the nodes kept (:mod:`slurmgpu.elastic.
  shrunk_env`; Slurm leaves the batch script's as they were) and ``SGPU_HEAD_ADDR``
  found again; the training resumes from the checkpoint at the new size.
- **SIGTERM** (the requeue, scancel, preemption, the time limit's kill), SIGINT, SIGHUP:
  relayed to every process of the tree. Once the training processes (those that caught the
  checkpoint signal) have exited, what is left (torchrun, shells) is SIGKILLed at once:
  torchrun's own teardown with torch loaded takes over a second and holds nothing worth
  waiting for. After ``SGPU_LAUNCH_TERM_WAIT`` seconds (default 20, under most sites'
  ``KillWait``) whatever is left is SIGKILLed anyway.
- **No worker outlives the job**: the launcher is a child subreaper (``PR_SET_CHILD_
  SUBREAPER``), so workers whose parent died (torchrun killed) are re-parented to it and
  still found; when the command ends by itself, what it left behind is terminated, then
  killed. The launcher exits with the command's status (128 + signal for a signal).

Every event goes to ``<state dir>/<job id>/launch.jsonl`` (one JSON object a line, with
``at``: seconds since the epoch), which bench/resize_path.py reads for the exit times.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from slurmgpu.elastic.runtime import _count_devices, _env_int, _signal_number
from slurmgpu.elastic.shrunk_env import shrunk_env
from slurmgpu.elastic.spec import DEFAULT_DIR_NAME, job_dir, read_ack

__all__ = ["LAUNCH_LOG", "Launcher", "catches", "head_address", "in_step", "main", "tree"]

LAUNCH_LOG = "launch.jsonl"
DEFAULT_TERM_WAIT_S = 20.0
TIME_LIMIT_SLACK_S = 60.0  # Slurm checks time limits (and sends --signal) about once a minute
POLL_S = 0.1
REAP_EVERY_S = 1.0
_PR_SET_CHILD_SUBREAPER = 36


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt``, Linux)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        return False
    return False


def tree(root: int) -> list[psutil.Process]:
    """The live descendants of ``root`` (not ``root`` itself), zombies left out."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.Error:
            continue
    return out


def _alive(processes: Sequence[psutil.Process]) -> bool:
    """Whether any of ``processes`` still runs (a zombie has ended)."""
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _time_left_s(job_id: int) -> float | None:
    """Seconds before the job's time limit (``squeue %L``); None when unknown/unlimited."""
    from slurmgpu.slurm.parse import TimeStringError, parse_time_limit

    try:
        proc = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%L"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = proc.stdout.strip()
    if proc.returncode != 0 or not text:
        return None
    try:
        left = parse_time_limit(text.splitlines()[0])
    except TimeStringError:
        return None
    return None if left is None else left.total_seconds()


def _signal_steps(job_id: int, signum: int) -> str | None:
    """``scancel --signal=SIG JOB``: every step of the job, not the batch shell."""
    from slurmgpu.slurm.cli import CliSlurmClient
    from slurmgpu.slurm.client import SlurmError

    try:
        CliSlurmClient(timeout_s=30).signal(job_id, signal.Signals(signum).name[3:])
    except SlurmError as exc:
        return str(exc)
    return None


def _node_addr(nodelist: str) -> str | None:
    """The ``NodeAddr`` of the first node of ``nodelist`` (``scontrol``), None on failure."""
    try:
        names = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        first = names.stdout.split()[0] if names.returncode == 0 and names.stdout else ""
        if not first:
            return None
        node = subprocess.run(
            ["scontrol", "-o", "show", "node", first],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for field_text in node.stdout.split():
        if field_text.startswith("NodeAddr="):
            return field_text.removeprefix("NodeAddr=") or first
    return first


def head_address(env: Mapping[str, str]) -> str | None:
    """Where the job's first node is reached: its ``NodeAddr`` (``scontrol``), else this
    host's own address (the batch shell runs on the allocation's first node); None when
    neither is known."""
    nodelist = env.get("SLURM_JOB_NODELIST", "").strip()
    addr = _node_addr(nodelist) if nodelist else None
    if addr:
        return addr
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def _job_nodes(job_id: int) -> tuple[str, int, str] | None:
    """(state, node count, node list) of the job as Slurm shows it (``squeue --json``
    through the release's decoder); None when Slurm cannot say."""
    from slurmgpu.slurm.cli import CliSlurmClient
    from slurmgpu.slurm.client import SlurmError
    from slurmgpu.slurm.parse import compress_hostlist

    try:
        job = CliSlurmClient(timeout_s=30).job(job_id)
    except SlurmError:
        return None
    if job is None or not job.nodes:
        return None
    return job.state.name, job.node_count, compress_hostlist(job.nodes)


def _requeue(job_id: int) -> str | None:
    """``scontrol requeue JOB``; None when done, else why not."""
    try:
        proc = subprocess.run(
            ["scontrol", "requeue", str(job_id)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


@dataclass
class Launcher:
    """Supervises one command (see the module docstring)."""

    command: Sequence[str]
    job_id: int
    state_dir: Path
    checkpoint_signal: signal.Signals = signal.SIGUSR2
    grace_s: float = 120.0
    term_wait_s: float = DEFAULT_TERM_WAIT_S
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    time_left: Callable[[int], float | None] = _time_left_s
    requeue: Callable[[int], str | None] = _requeue
    in_step: bool = False  # inside a job step (srun): never requeues, never relays to steps
    nodes: int = 1  # the job's node count
    signal_steps: Callable[[int, int], str | None] = _signal_steps
    find_head: Callable[[Mapping[str, str]], str | None] = head_address
    job_nodes: Callable[[int], tuple[str, int, str] | None] = _job_nodes
    clock: Callable[[], float] = time.monotonic
    _child: subprocess.Popen[bytes] | None = None
    _pending: list[int] = field(default_factory=list)  # signals received, not yet handled
    _stopping_since: float | None = None
    _workers: list[psutil.Process] = field(default_factory=list)  # caught the signal at stop
    _requeue_after_ack: tuple[int, float] | None = None  # (acks before, deadline)

    # ------------------------------------------------------------------ log

    @property
    def log_path(self) -> Path:
        return job_dir(self.state_dir, self.job_id) / LAUNCH_LOG

    def event(self, name: str, **fields: Any) -> None:
        record = {"event": name, "at": round(time.time(), 3), "pid": os.getpid(), **fields}
        with contextlib.suppress(OSError):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        print(f"sgpu launch: {name} {text}".rstrip(), file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)  # acted on by the loop, never inside the handler

    def install_handlers(self) -> None:
        for sig in (self.checkpoint_signal, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    # ------------------------------------------------------------------ run

    def start(self) -> None:
        env = dict(self.env)
        env["SGPU_LAUNCHER_PID"] = str(os.getpid())
        env.setdefault("SGPU_GPUS", str(max(_count_devices(self.env), 1)))
        if not self.in_step and "SGPU_HEAD_ADDR" not in env:
            # On one node every torchrun agent is here: no scontrol call on the way in.
            head = self.find_head(self.env) if self.nodes > 1 else "127.0.0.1"
            if head:
                env["SGPU_HEAD_ADDR"] = head
        # Ignored across exec: torchrun and shells in the tree survive the signal.
        previous = signal.signal(self.checkpoint_signal, signal.SIG_IGN)
        try:
            self._child = subprocess.Popen(list(self.command), env=env, start_new_session=True)
        finally:
            signal.signal(self.checkpoint_signal, previous)
        self.event("start", child=self._child.pid, command=list(self.command))

    def run(self) -> int:
        """Start the command, supervise it, return the launcher's exit status."""
        subreaper = _become_subreaper()
        self.install_handlers()
        try:
            self.start()
        except OSError as exc:
            self.event("failed", error=str(exc))
            return 127
        if not subreaper:
            self.event("note", detail="not a subreaper: orphaned workers are not tracked")
        assert self._child is not None
        status: int | None = None
        reaped = self.clock()
        while status is None:
            while self._pending:
                self._handle(self._pending.pop(0))
            self._maybe_requeue()
            since = self._stopping_since
            if since is not None and self.clock() - since > self.term_wait_s:
                self._kill_all("term_wait over")
            elif since is not None and self._workers and not _alive(self._workers):
                # The training processes have ended (their checkpoint is durable): what is
                # left is torchrun's or a shell's teardown, over a second with torch loaded.
                self._kill_all("the training processes have exited")
            if self.clock() - reaped >= REAP_EVERY_S:
                self._reap_orphans()
                reaped = self.clock()
            status = self._child.poll()
            if status is not None and self._restart_if_shrunk(status):
                status = None
            if status is None:
                time.sleep(POLL_S)
        # The command is over: a checkpoint signal from here on (a resize decided as the
        # job ended) must not kill the launcher while it exits, which Slurm would count as
        # the job failing. Python restores a caught signal's default action at exit, not
        # an ignored one's.
        signal.signal(self.checkpoint_signal, signal.SIG_IGN)
        code = status if status >= 0 else 128 - status
        self.event("command_exited", status=code)
        self._clean_up()
        self.event("exit", status=code)
        return code

    def _restart_if_shrunk(self, status: int) -> bool:
        """The command ended because the daemon shrank the job in place: start it again
        on the nodes kept (see the module docstring). False: the command's end stands."""
        if self.in_step or self.nodes <= 1 or self._stopping_since is not None:
            return False
        seen = self.job_nodes(self.job_id)
        if seen is None or seen[0] != "RUNNING" or not 1 <= seen[1] < self.nodes:
            return False
        _state, nodes, nodelist = seen
        self.event("command_exited", status=status if status >= 0 else 128 - status)
        self._clean_up()
        self.env = shrunk_env(self.env, nodes, nodelist)
        self.event("shrunk_in_place", nodes=nodes, nodelist=nodelist, was=self.nodes)
        self.nodes = nodes
        try:
            self.start()
        except OSError as exc:
            self.event("failed", error=str(exc))
            return False
        return True

    def _handle(self, signum: int) -> None:
        assert self._child is not None
        if signum == self.checkpoint_signal:
            ack = read_ack(self.state_dir, self.job_id)  # before the relay: it may ack at once
            before = ack.acks if ack else 0
            everything = self._all()
            targets = [p.pid for p in everything if catches(p.pid, signum)]
            for pid in targets:
                self._send(pid, signum)
            self.event("checkpoint_signal", relayed_to=targets)
            to_steps = not self.in_step and self._has_steps(everything)
            if to_steps:
                # Tasks of srun steps (a launcher per node) are not in this tree, and
                # neither Slurm's --signal=B: nor (on 22.05) scancel --full reaches them.
                error = self.signal_steps(self.job_id, signum)
                self.event("relayed_to_steps", error=error)
            if not targets and not to_steps:
                self.event(
                    "warning",
                    detail=f"no process catches SIG{self.checkpoint_signal.name[3:]}: "
                    "does the training call slurmgpu.elastic.init()?",
                )
            if self.in_step:
                return  # the batch launcher requeues at the time limit
            left = self.time_left(self.job_id)
            if left is not None and left <= self.grace_s + TIME_LIMIT_SLACK_S:
                self._requeue_after_ack = (before, self.clock() + self.grace_s)
                self.event("time_limit", seconds_left=round(left, 1), acks_before=before)
            return
        # SIGTERM, SIGINT, SIGHUP: the job is ending (requeue, scancel, preemption).
        everything = self._all()
        if self._stopping_since is None:
            self._workers = [p for p in everything if catches(p.pid, self.checkpoint_signal)]
        targets = [p.pid for p in everything]
        for pid in targets:
            self._send(pid, signal.SIGTERM if signum == signal.SIGHUP else signum)
        if self._stopping_since is None:
            self._stopping_since = self.clock()
        self._requeue_after_ack = None
        self.event("stop_signal", signal=signal.Signals(signum).name, relayed_to=targets)

    def _has_steps(self, processes: Sequence[psutil.Process]) -> bool:
        """Whether the command runs job steps: several nodes, or an ``srun`` in the tree."""
        if self.nodes > 1:
            return True
        for p in processes:
            with contextlib.suppress(psutil.Error):
                if p.name() == "srun":
                    return True
        return False

    def _maybe_requeue(self) -> None:
        if self._requeue_after_ack is None:
            return
        before, deadline = self._requeue_after_ack
        ack = read_ack(self.state_dir, self.job_id)
        if ack is not None and ack.acks > before:
            self._requeue_after_ack = None
            error = self.requeue(self.job_id)
            self.event("requeue", step=ack.step, error=error)
        elif self.clock() > deadline:
            self._requeue_after_ack = None
            self.event("no_ack", detail="no checkpoint acknowledged within the grace")

    # ------------------------------------------------------------------ processes

    def _all(self) -> list[psutil.Process]:
        """The command and everything under it (orphans re-parent to us: a subreaper)."""
        return tree(os.getpid())

    @staticmethod
    def _send(pid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)

    def _reap_orphans(self) -> None:
        """Collect exited re-parented processes (our own child is left to Popen)."""
        child = self._child.pid if self._child is not None else -1
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        for p in children:
            try:
                if p.pid != child and p.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(p.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                continue

    def _kill_all(self, why: str) -> None:
        left = self._all()
        for p in left:
            self._send(p.pid, signal.SIGKILL)
        if left:
            self.event("killed", pids=[p.pid for p in left], why=why)
        self._stopping_since = None
        self._workers = []

    def _clean_up(self) -> None:
        """The command has exited: no process of its tree may stay behind.

        The training processes (those that catch the checkpoint signal) get what is left of
        the stop's wait to finish their checkpoint; the rest (torchrun, whose teardown with
        torch loaded takes over a second) is killed as soon as they are gone. A tree with no
        training process gets SIGTERM and a few seconds.
        """
        left = self._all()
        if not left:
            return
        since = self._stopping_since
        if since is None:
            for p in left:
                self._send(p.pid, signal.SIGTERM)
            budget = min(self.term_wait_s, 5.0)
        else:
            budget = max(self.term_wait_s - (self.clock() - since), 0.0)
        pids = {p.pid for p in left}
        workers = [p for p in self._workers if p.pid in pids]
        workers += [p for p in left if p not in workers and catches(p.pid, self.checkpoint_signal)]
        waited_for = workers or left
        deadline = self.clock() + budget
        while _alive(waited_for) and self.clock() < deadline:  # a zombie has ended
            time.sleep(0.02)
        alive = [p for p in left if _alive([p])]
        for p in alive:
            self._send(p.pid, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5.0)
        self.event("cleaned_up", terminated=[p.pid for p in left], killed=[p.pid for p in alive])
        self._reap_orphans()


_FIRST_SPECIAL_STEP = 0xFFFFFFF0  # Slurm's batch, extern, interactive... step ids


def in_step(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of an ``srun`` job step (not the batch script).

    22.05 sets no ``SLURM_STEP_ID`` in the batch script; 26.05 sets the batch step's
    special id as a negative number (-5); a step's tasks get 0, 1, ...
    """
    text = env.get("SLURM_STEP_ID", "").strip()
    return text.isdigit() and int(text) < _FIRST_SPECIAL_STEP


def from_env(command: Sequence[str], env: Mapping[str, str] | None = None) -> Launcher:
    e = dict(os.environ if env is None else env)
    job_id = _env_int(e, "SLURM_JOB_ID", default=0)
    configured = e.get("SGPU_ELASTIC_DIR", "").strip()
    base = e.get("SLURM_SUBMIT_DIR", "").strip() or os.getcwd()
    state_dir = Path(configured or os.path.join(base, DEFAULT_DIR_NAME))
    grace_text = e.get("SGPU_CHECKPOINT_HOLD", "").strip()
    wait_text = e.get("SGPU_LAUNCH_TERM_WAIT", "").strip()
    try:
        grace = float(grace_text) if grace_text else 120.0
        term_wait = float(wait_text) if wait_text else DEFAULT_TERM_WAIT_S
    except ValueError as exc:
        raise ValueError(f"SGPU_CHECKPOINT_HOLD/SGPU_LAUNCH_TERM_WAIT: {exc}") from None
    return Launcher(
        command=list(command),
        job_id=job_id,
        state_dir=state_dir,
        checkpoint_signal=_signal_number(e.get("SGPU_CHECKPOINT_SIGNAL", "USR2") or "USR2"),
        grace_s=max(grace, 0.0),
        term_wait_s=max(term_wait, 0.0),
        env=e,
        in_step=in_step(e),
        nodes=max(_env_int(e, "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1), 1),
    )


def main(command: Sequence[str]) -> int:
    return from_env(command).run()
