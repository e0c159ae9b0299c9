"""A trace replayed through a real lab cluster: the daemon's stack, the site users'
submissions at their times, and what Slurm and the daemon did to each job.

- :func:`daemon_stack`: ``sgpu daemon`` (the policy config it is given) and one
  ``sgpu agent`` per node with the simulated GPU probe, as real processes, on a store
  of their own in the replay's directory; stopped on leaving.
- :func:`user_submitter`: submits a job as one of the site profile's Unix users (the
  caller says how to become one) through ``sgpu submit``, malleable through
  :mod:`slurmgpu.elastic`, its command the stand-in :mod:`slurmgpu.lab.replayload`.
- :class:`Replayer`: submits each job at its time, polls Slurm every ``poll_s`` (as the
  cluster's administrator: it sees every user's jobs), integrates each job's allocated
  GPUs over time, and stops by itself when every job has ended or at its deadline
  (cancelling what is left, reported ``unfinished``); then reads each job's resize
  transactions from the daemon's store.

The jobs are planned by :mod:`slurmgpu.sim.replayplan` (the lab sits beside the
simulator, so it takes them by their attributes, :class:`Submission`).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from slurmgpu.cycle.resize import KIND, durations
from slurmgpu.model import Job, JobState
from slurmgpu.slurm import sbatch
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.store import open_store
from slurmgpu.store.transactions import TransactionStore

__all__ = [
    "CtldTimeline",
    "Observed",
    "ReplayLabError",
    "Replayer",
    "Stack",
    "Submission",
    "TxSeen",
    "ctld_timeline",
    "daemon_stack",
    "first_calculation_s",
    "toml_text",
    "user_submitter",
]

_HTTP_TIMEOUT_S = 2.0
_SUBMITTERS = 8  # submissions in flight at once (one a user)


class ReplayLabError(RuntimeError):
    """The replay's stack or a submission failed; the message says which, in one line."""


class Submission(Protocol):
    """What the replay needs of a planned job (slurmgpu.sim.replayplan.ReplayJob)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def at_s(self) -> float: ...
    @property
    def gpus(self) -> int: ...
    @property
    def min_gpus(self) -> int: ...
    @property
    def max_gpus(self) -> int: ...
    @property
    def work(self) -> float: ...
    @property
    def time_limit_s(self) -> float: ...
    def slurm_limit_s(self) -> float: ...
    def rates_text(self) -> str: ...


TomlValue = str | int | float | bool | Sequence[float]


_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")
_JOB_ID = re.compile(r"JobId=(\d+)")
_INIT_PRIO = re.compile(r"InitPrio=(\d+)")
_NODES = re.compile(r"(?:NodeList=| in \S+ on )(\S+)")


@dataclass
class CtldTimeline:
    """What a lab's slurmctld log (SlurmctldDebug=info) says of its jobs and its
    fair share: when priority/multifactor's decay thread started (its calculations fall
    every PriorityCalcPeriod from then), each job's submission and initial priority, and
    its runs (an allocation, by the main scheduler or backfill, to its completion or
    requeue)."""

    decay_start: datetime | None = None
    submitted: dict[int, tuple[datetime, int]] = field(default_factory=dict)
    runs: dict[int, list[tuple[datetime, datetime | None]]] = field(default_factory=dict)
    # each run's nodes, as its allocation line names them (a hostlist expression)
    nodes: dict[int, list[str]] = field(default_factory=dict)


def ctld_timeline(ctld_log: str) -> CtldTimeline:
    """:class:`CtldTimeline` of a slurmctld log's text; lines it does not know are left
    alone (22.05 through 26.05 word these the same)."""
    out = CtldTimeline()
    started: datetime | None = None
    for line in ctld_log.splitlines():
        m = _LOG_TIME.match(line)
        if m is None:
            continue
        at, text = datetime.fromisoformat(m.group(1)), m.group(2)
        if "_read_last_decay_ran" in text:
            out.decay_start = at
        elif started is None and "started on cluster" in text:
            started = at
        job = _JOB_ID.search(text)
        if job is None:
            continue
        job_id = int(job.group(1))
        if "_slurm_rpc_submit_batch_job" in text and (prio := _INIT_PRIO.search(text)):
            out.submitted[job_id] = (at, int(prio.group(1)))
        elif "sched: Allocate" in text or "_start_job: Started" in text:
            out.runs.setdefault(job_id, []).append((at, None))
            where = _NODES.search(text)
            out.nodes.setdefault(job_id, []).append(where.group(1) if where else "")
        elif ("_job_complete" in text and text.endswith(" done")) or "equeu" in text:
            runs = out.runs.get(job_id)
            if runs and runs[-1][1] is None:
                runs[-1] = (runs[-1][0], at)
    if out.decay_start is None:
        out.decay_start = started
    return out


def first_calculation_s(ctld_log: str, period_s: float) -> float | None:
    """Seconds from a replay's first submission to the first fair-share calculation after
    it, read from the lab's slurmctld log: priority/multifactor's decay thread computes
    every ``period_s`` (PriorityCalcPeriod) from its start (its ``_read_last_decay_ran``
    line, else slurmctld's "started" line), whatever the jobs. None when the log has no
    start or no submission."""
    timeline = ctld_timeline(ctld_log)
    if timeline.decay_start is None or not timeline.submitted:
        return None
    first = min(at for at, _ in timeline.submitted.values())
    since = (first - timeline.decay_start).total_seconds()
    return period_s - since % period_s


def toml_text(sections: Mapping[str, Mapping[str, TomlValue]]) -> str:
    """The TOML text of ``{"section": {"key": value}}`` (strings, numbers, booleans and
    lists of numbers: what the daemon's policy sections hold)."""

    def value(v: TomlValue) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, int | float):
            return repr(v)
        return "[" + ", ".join(repr(float(x)) for x in v) + "]"

    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/healthz", timeout=_HTTP_TIMEOUT_S
        ) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@dataclass
class Stack:
    """The running daemon stack: its store, its environment, the simulated GPUs' dir."""

    work: Path
    db: str
    env: dict[str, str]
    sim_dir: Path
    port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def sgpu(self, *args: str, timeout_s: float = 120.0) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "slurmgpu", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise ReplayLabError(f"sgpu {' '.join(args)}: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def logs_with_tracebacks(self) -> list[str]:
        return [p.name for p in self.work.glob("*.log") if "Traceback" in p.read_text()]


@contextmanager
def daemon_stack(
    work: Path,
    *,
    nodes: Sequence[str],
    gres_conf: Path,
    policy_toml: str,
    env: Mapping[str, str] | None = None,
    interval: str = "1s",
    agent_interval: str = "2s",
    start_timeout_s: float = 60.0,
) -> Iterator[Stack]:
    """``sgpu daemon`` with ``policy_toml`` and an agent per node of ``nodes``; the
    daemon runs as this process's user (root on the lab). Left: every process stopped
    (SIGTERM, then SIGKILL after 60 s)."""
    config = work / "config.toml"
    config.write_text(
        f'[daemon]\nsecret_file = "{work / "site.secret"}"\nmax_backoff = "2s"\n'
        '[slurm]\ncommand_timeout = "20s"\n' + policy_toml
    )
    db = f"sqlite:///{work / 'state.db'}"
    sim_dir = work / "simgpu"
    sim_dir.mkdir(exist_ok=True)
    sim_dir.chmod(0o1777)  # the site users' jobs declare their load here
    port = _free_port()
    full_env = {
        **(env or os.environ),
        "SGPU_DB": db,
        "SGPU_CONFIG": str(config),
        "SGPU_SIMGPU_DIR": str(sim_dir),
    }
    stack = Stack(work, db, full_env, sim_dir, port)
    stack.sgpu("db", "upgrade")
    sgpu = [sys.executable, "-m", "slurmgpu"]
    try:
        with (work / "daemon.log").open("ab") as log:
            stack.procs.append(
                subprocess.Popen(
                    [*sgpu, "daemon", "--interval", interval, "--listen", f"127.0.0.1:{port}"],
                    env=full_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + start_timeout_s
        while not _healthy(port):
            if stack.procs[0].poll() is not None or time.monotonic() > deadline:
                raise ReplayLabError(f"the daemon did not come up; see {work / 'daemon.log'}")
            time.sleep(0.5)
        for node in nodes:
            token = work / f"{node}.token"
            stack.sgpu("node-token", node, "--out", str(token))
            with (work / f"agent-{node}.log").open("ab") as log:
                stack.procs.append(
                    subprocess.Popen(
                        [
                            *sgpu,
                            *("agent", "--node", node, "--daemon", f"http://127.0.0.1:{port}"),
                            *("--interval", agent_interval, "--probe", "sim"),
                            *("--sim-dir", str(sim_dir), "--gres-conf", str(gres_conf)),
                            *("--auth", "hmac", "--token-file", str(token)),
                            *("--spool-dir", str(work / f"spool-{node}")),
                        ],
                        env=full_env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        yield stack
    finally:
        for proc in reversed(stack.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in stack.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


Submit = Callable[[Submission], int]


def user_submitter(
    python: Sequence[str],
    env: Mapping[str, str],
    work: Path,
    *,
    as_user: Callable[[str], Sequence[str]] | None = None,
    checkpoint_grace: str = "30s",
    tick_s: float = 0.5,
    util_pct: float = 80.0,
) -> Submit:
    """A :data:`Submit` that runs ``sgpu submit`` with ``python`` (an interpreter the
    submitting user may run, with slurmgpu importable through ``env``): as the job's user
    when ``as_user`` gives the command prefix that becomes them (the caller's: slurmgpu
    itself never changes its uid), else as this process's user. Each job logs to
    ``work/job-<index>.jsonl``; its elastic state lives under ``work/elastic``."""
    elastic = work / "elastic"
    elastic.mkdir(exist_ok=True)
    elastic.chmod(0o1777)

    def submit(job: Submission) -> int:
        command = " ".join(
            [
                *python,
                "-m",
                "slurmgpu.lab.replayload",
                f"--work {job.work:.6g}",
                f"--rates {job.rates_text()}",
                f"--tick {tick_s:g}",
                f"--util {util_pct:g}",
                f"--log {work / f'job-{job.index}.jsonl'}",
            ]
        )
        malleable: list[str] = []
        if job.max_gpus > job.min_gpus:
            malleable = [
                *("--malleable", f"{job.min_gpus}:{job.max_gpus}"),
                *("--checkpoint-grace", checkpoint_grace, "--elastic-dir", str(elastic)),
            ]
        limit = timedelta(seconds=job.slurm_limit_s())
        argv = [
            *python,
            *("-m", "slurmgpu", "submit", "--parsable", "-o", "/dev/null"),
            *malleable,
            *sbatch.gres_gpus(job.gpus).argv,
            *("-N", "1", *sbatch.time_limit(limit).argv),
            *("-J", job.name, "--wrap", command),
        ]
        prefix = list(as_user(job.user)) if as_user is not None else []
        proc = subprocess.run(
            [*prefix, *argv],
            env=dict(env),
            cwd=str(work),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise ReplayLabError(
                f"job {job.index} as {job.user}: sgpu submit: {proc.stderr.strip()[-300:]}"
            )
        return int(proc.stdout.strip().split(";")[0])

    return submit


@dataclass(frozen=True, slots=True)
class TxSeen:
    """One resize transaction of a job, as the daemon's store has it."""

    policy: str
    state: str
    from_gpus: int | None
    to_gpus: int | None
    phases: Mapping[str, float]


@dataclass
class Observed:
    """What the replay saw of one job; times in seconds from the replay's start."""

    index: int
    name: str
    user: str
    job_id: int | None = None
    submitted_s: float | None = None
    started_s: float | None = None
    ended_s: float | None = None
    state: str = "not submitted"
    gpu_seconds: float = 0.0
    restarts: int = 0
    transactions: tuple[TxSeen, ...] = ()
    error: str = ""  # why it was not submitted
    final_since: float | None = None  # first poll that saw it in a final state
    acct_at: float | None = None  # GPU time counted up to here (while it runs)
    acct_gpus: int = 0  # GPUs it held at acct_at


# A poll or an arrival this close to its time is taken now (a wake-up that float
# rounding left a hair short of it would otherwise sleep for nothing, again and again).
_EARLY_S = 1e-3


class Replayer:
    """Submit ``jobs`` at their times and watch them to the end (module docstring)."""

    def __init__(
        self,
        submit: Submit,
        slurm: CliSlurmClient,
        *,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.submit = submit
        self.slurm = slurm
        self.poll_s = poll_s
        self.clock = clock
        self.sleep = sleep
        self.progress = progress

    def run(self, jobs: Sequence[Submission], timeout_s: float) -> list[Observed]:
        """Every job submitted at ``at_s`` and watched until it ends, or until
        ``timeout_s`` after the start (then the rest is cancelled). Submissions run in
        threads (``sgpu submit`` as a user takes seconds on a loaded machine), so one slow
        submission does not delay the next job's arrival."""
        t0 = self.clock()
        seen = {j.index: Observed(j.index, j.name, j.user) for j in jobs}
        queue = sorted(jobs, key=lambda j: (j.at_s, j.index))
        in_flight: dict[Future[int], Observed] = {}
        by_id: dict[int, Observed] = {}
        said = 0.0
        listed_at = -math.inf
        with ThreadPoolExecutor(max_workers=_SUBMITTERS, thread_name_prefix="submit") as pool:
            while True:
                now = self.clock()
                while queue and queue[0].at_s <= now - t0 + _EARLY_S:
                    job = queue.pop(0)
                    o = seen[job.index]
                    o.submitted_s, o.state = now - t0, "SUBMITTING"
                    in_flight[pool.submit(self.submit, job)] = o
                for fut in [f for f in in_flight if f.done()]:
                    o = in_flight.pop(fut)
                    try:
                        o.job_id = fut.result()
                    except (ReplayLabError, OSError, ValueError, subprocess.SubprocessError) as exc:
                        o.state, o.error = "submit failed", str(exc)[:300]
                        continue
                    o.state = "PENDING"
                    by_id[o.job_id] = o
                if self.clock() >= listed_at + self.poll_s - _EARLY_S:  # not on an arrival
                    listed = {j.job_id: j for j in self.slurm.jobs() if j.job_id in by_id}
                    listed_at = self.clock()
                    for job_id, o in by_id.items():
                        self._update(o, listed.get(job_id), listed_at, t0)
                now = self.clock()
                open_jobs = [o for o in by_id.values() if not _ended(o)]
                if self.progress is not None and now - said >= 30:
                    said = now
                    self.progress(
                        f"{now - t0:6.0f} s: {len(by_id)}/{len(jobs)} submitted, "
                        f"{len(by_id) - len(open_jobs)} ended"
                    )
                if not queue and not in_flight and not open_jobs:
                    break
                if now - t0 > timeout_s:
                    for fut in in_flight:
                        fut.cancel()
                    self._cancel([o for o in open_jobs if o.job_id is not None])
                    break
                # to the next poll, or to the next arrival if it comes first: on a fixed
                # 1 s tick, jobs were submitted 0-1.2 s late (median 0.5 s over four sets of
                # 63 on 2026-12-07), up to 60 trace seconds each at C = 60
                wait = listed_at + self.poll_s - self.clock()
                if queue:
                    wait = min(wait, t0 + queue[0].at_s - self.clock())
                self.sleep(max(0.0, wait))
        return list(seen.values())

    def _update(self, o: Observed, job: Job | None, now: float, t0: float) -> None:
        """Fold one poll into ``o``. A job's submission time is its arrival (when the
        replay began submitting it: the submission's own latency is part of its JCT); its
        start and end are Slurm's (whole seconds). GPU time is the allocation integrated from one
        poll to the next, from Slurm's start time and to its end time."""
        if _ended(o):
            return
        if job is None:
            # gone from squeue before its end was seen (MinJobAge): ended, state unknown
            if o.started_s is not None:
                o.state, o.ended_s = "VANISHED", now - t0
            return
        o.restarts = max(o.restarts, job.restart_count)
        start = job.start_time.timestamp() if job.start_time is not None else None
        if job.state is JobState.RUNNING:
            if o.started_s is None:
                o.started_s = (start if start is not None else now) - t0
            if o.acct_at is None:
                o.acct_at = start if start is not None and start <= now else now
                o.acct_gpus = job.allocated_gpus
            o.gpu_seconds += o.acct_gpus * max(0.0, now - o.acct_at)
            o.acct_at, o.acct_gpus = now, job.allocated_gpus
        elif o.acct_at is not None:  # stopped since the last poll: requeued or ended
            end = job.end_time.timestamp() if job.end_time is not None else now
            stop = end if o.acct_at <= end <= now else now
            o.gpu_seconds += o.acct_gpus * max(0.0, stop - o.acct_at)
            o.acct_at = None
        if start is not None and o.started_s is None and job.state is not JobState.PENDING:
            # ran (and stopped) between two polls: Slurm's times are all there is of it
            end = job.end_time.timestamp() if job.end_time is not None else now
            o.started_s = start - t0
            o.gpu_seconds += (job.allocated_gpus or job.gpus.gpus) * max(0.0, end - start)
        o.state = job.state.value
        # A requeue (a resize's, Slurm's preemption) passes through terminal-looking
        # states: an end counts once seen on two polls in a row, with no requeue flag.
        if _final(job):
            if o.final_since is None:
                o.final_since = now
            elif o.final_since < now:
                end = job.end_time.timestamp() if job.end_time is not None else o.final_since
                o.ended_s = min(end, o.final_since) - t0
        else:
            o.final_since = None

    def _cancel(self, left: Sequence[Observed]) -> None:
        ids = [str(o.job_id) for o in left]
        if ids:
            _scancel(self.slurm, ids)
        for o in left:
            o.state = "unfinished"


def _final(job: Job) -> bool:
    return (
        job.state.is_terminal
        and job.state is not JobState.PREEMPTED
        and "REQUEUED" not in job.state_flags
        and not job.state_flags & {"REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING"}
    )


def _ended(o: Observed) -> bool:
    return o.ended_s is not None or o.state in ("unfinished", "submit failed")


def read_transactions(db: str, observed: Sequence[Observed]) -> None:
    """Fill each observed job's resize transactions from the daemon's store ``db``."""
    store = open_store(db, migrate=False)
    txs = TransactionStore(store.engine, store.cluster)
    for o in observed:
        if o.job_id is None:
            continue
        rows = reversed(txs.recent([KIND], job_id=o.job_id, limit=1000))
        o.transactions = tuple(
            TxSeen(
                policy=str(r.payload.get("policy") or ""),
                state=r.state,
                from_gpus=_int(r.payload.get("from_gpus")),
                to_gpus=_int(r.payload.get("to_gpus")),
                phases=durations(r),
            )
            for r in rows
        )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


SYSTEM_PYTHON = "/usr/bin/python3"


def site_python() -> list[str]:
    """The interpreter the site's users run slurmgpu with: the system ``python3`` of this
    Python's minor version (this one may live where they cannot run it, e.g. under
    /root); ReplayLabError saying why when there is none."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise ReplayLabError(f"no {SYSTEM_PYTHON} for the site users to run slurmgpu with")
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(tuple(sys.version_info[:2]))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.stdout.strip() != str(tuple(sys.version_info[:2])):
        raise ReplayLabError(
            f"{SYSTEM_PYTHON} is {proc.stdout.strip() or 'broken'}, not "
            f"{tuple(sys.version_info[:2])}: it cannot load this Python's packages"
        )
    return [SYSTEM_PYTHON]


def user_env(lab_env: Mapping[str, str], checkout: Path, sim_dir: Path) -> dict[str, str]:
    """A site user's environment: the lab's ``SLURM_CONF`` and ``PATH``, the checkout and
    this Python's packages importable (:func:`site_python`), the simulated GPUs' dir."""
    purelib = sysconfig.get_paths()["purelib"]
    return {
        "PATH": lab_env.get("PATH", os.environ.get("PATH", "/usr/bin:/bin")),
        "SLURM_CONF": lab_env["SLURM_CONF"],
        "PYTHONPATH": f"{checkout}:{purelib}",
        "SGPU_SIMGPU_DIR": str(sim_dir),
        "LANG": "C.UTF-8",
    }


def _scancel(slurm: CliSlurmClient, ids: Sequence[str]) -> None:
    """``scancel`` of ``ids`` on the cluster ``slurm`` talks to (its conf and commands)."""
    env = {**os.environ, **({"SLURM_CONF": slurm.slurm_conf} if slurm.slurm_conf else {})}
    scancel = str(Path(slurm.bin_dir) / "scancel") if slurm.bin_dir else "scancel"
    subprocess.run([scancel, *ids], env=env, capture_output=True, timeout=60, check=False)


def cancel_everything(slurm: CliSlurmClient, timeout_s: float = 120.0) -> None:
    """Cancel every job on the lab (as its administrator) and wait until none is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        ids = sorted({str(j.job_id) for j in slurm.jobs() if not j.state.is_terminal})
        if not ids:
            return
        if time.monotonic() > deadline:
            raise ReplayLabError(f"jobs {', '.join(ids[:10])} still on the lab after scancel")
        _scancel(slurm, ids)
        time.sleep(1.0)


def replay_on_lab(
    jobs: Sequence[Submission],
    *,
    work: Path,
    nodes: Sequence[str],
    gres_conf: Path,
    lab_env: Mapping[str, str],
    policy_toml: str,
    python: Sequence[str],
    checkout: Path,
    timeout_s: float,
    bin_dir: Path | None = None,
    as_user: Callable[[str], Sequence[str]] | None = None,
    user_env_extra: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Observed]:
    """``jobs`` through the lab whose environment is ``lab_env`` under the daemon with
    ``policy_toml``: submitted as their users at their times, watched to the end (or to
    ``timeout_s``), their resize transactions read from the daemon's store. Every job
    left on the lab is cancelled before this returns. ``bin_dir``: a Slurm chroot's
    client commands' wrappers; ``as_user``: :func:`user_submitter`'s; ``user_env_extra``:
    replaces or adds to the users' environment (:func:`user_env`; a chroot's ``PATH``)."""
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o1777)  # the users' jobs write their logs here
    slurm = CliSlurmClient(
        timeout_s=20, slurm_conf=lab_env["SLURM_CONF"], bin_dir=str(bin_dir) if bin_dir else None
    )
    env = {**os.environ, **lab_env}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    with daemon_stack(
        work, nodes=nodes, gres_conf=gres_conf, policy_toml=policy_toml, env=env
    ) as s:
        users_env = {**user_env(env, checkout, s.sim_dir), **(user_env_extra or {})}
        submit = user_submitter(python, users_env, work, as_user=as_user)
        try:
            observed = Replayer(submit, slurm, progress=progress).run(jobs, timeout_s)
        finally:
            cancel_everything(slurm)
        read_transactions(s.db, observed)
    return observed
