"""The daemon's resize machinery as a separate process, so a test can SIGKILL it.

``python -m tests.slurm.resize_driver --db URL [--start JOB:FROM:TO] [--time-limit T]
[--kill-after CALL] [--overtaken-after SECONDS]``
builds what ``sgpu daemon`` builds (CliSlurmClient, TransactionStore, AuditStore,
MalleableActuator), recovers like a starting daemon, optionally starts a resize of a
malleable job ``sgpu submit`` sent, then observes every 0.3 s and advances the
open transactions until none is left. ``--kill-after signal|requeue|update|release``
SIGKILLs this process right after that Slurm call succeeded, before its state is
written: the worst moment for a daemon to die. ``--pause-before CALL --go FILE`` stops
just before that Slurm call (after the step has looked at the job and decided to make
it), prints ``driver: paused before CALL``, and goes on once FILE exists: the window in
which Slurm itself may act on the job (a preemption, say).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from slurmgpu.actuate.malleable import MalleableActuator
from slurmgpu.cycle.resize import ResizeSettings
from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.intent import Intent, SetTimeLimit
from slurmgpu.model import ClusterSnapshot
from slurmgpu.policy.base import Decision, Mode, resize_action
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.parse import parse_time_limit
from slurmgpu.store import open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.transactions import TransactionStore


class KillingSlurm(CliSlurmClient):
    def __init__(
        self, kill_after: str | None, pause_before: str | None = None, go: str | None = None
    ) -> None:
        super().__init__(timeout_s=20)
        self.kill_after = kill_after
        self.pause_before = pause_before
        self.go = go

    def _maybe_pause(self, call: str) -> None:
        if call != self.pause_before or self.go is None:
            return
        self.pause_before = None  # once
        print(f"driver: paused before {call}", flush=True)
        while not os.path.exists(self.go):
            time.sleep(0.2)
        print(f"driver: going on with {call}", flush=True)

    def _maybe_die(self, call: str) -> None:
        if call == self.kill_after:
            print(f"driver: SIGKILL after {call}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def signal_all(self, job_id: str | int, signal: str) -> None:
        self._maybe_pause("signal")
        super().signal_all(job_id, signal)
        self._maybe_die("signal")

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        self._maybe_pause("requeue")
        super().requeue(job_id, hold=hold)
        self._maybe_die("requeue")

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        self._maybe_pause("update")
        super().update_job(job_id, intents)
        self._maybe_die("update")

    def release(self, job_id: str | int) -> None:
        self._maybe_pause("release")
        super().release(job_id)
        self._maybe_die("release")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--start", help="JOB:FROM:TO")
    p.add_argument("--time-limit", help="TimeLimit for the new size, in the same update")
    p.add_argument("--kill-after")
    p.add_argument("--pause-before")
    p.add_argument("--go", help="with --pause-before: the file that lets it go on")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--overtaken-after", type=float, help="ResizeSettings.overtaken_after, s")
    args = p.parse_args()
    store = open_store(args.db)
    slurm = KillingSlurm(args.kill_after, args.pause_before, args.go)
    audit = AuditStore(store.engine)
    settings = ResizeSettings()
    if args.overtaken_after is not None:
        settings = ResizeSettings(overtaken_after=timedelta(seconds=args.overtaken_after))
    actuator = MalleableActuator(slurm, TransactionStore(store.engine), audit, settings)
    directory = MalleableDirectory(store)
    actuator.recover(datetime.now(UTC))

    def snapshot() -> ClusterSnapshot:
        return ClusterSnapshot(datetime.now(UTC), tuple(slurm.jobs()), (), slurm.version())

    if args.start:
        job_id, frm, to = (int(x) for x in args.start.split(":"))
        snap = snapshot()
        job = next(j for j in snap.jobs if j.job_id == job_id)
        limit = (SetTimeLimit.of(parse_time_limit(args.time_limit)),) if args.time_limit else ()
        action = resize_action("test", job, frm, to, "test driver", intents=limit)
        decision = Decision(action, Mode.ENFORCE, execute=True, notify=False)
        (result,) = actuator.carry_out([decision], snap, directory.specs(snap), snap.taken_at)
        print(f"driver: start {result.outcome} {result.error or ''}", flush=True)
        if result.outcome != "done":
            return 3
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        snap = snapshot()
        actuator.advance(snap, snap.taken_at)
        if not actuator.busy():
            print("driver: nothing in flight", flush=True)
            return 0
        time.sleep(0.3)
    print("driver: timed out", flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
