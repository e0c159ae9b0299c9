"""Fault injection on the real local cluster: bounded, self-stopping, counted.

Every test here injects one kind of fault into the running stack (real slurmctld and
slurmd, the daemon, four agents with simulated GPUs) and then checks the same outcome:
no job lost, none left held or acted on twice; no samples lost (each agent's sample
sequence numbers are contiguous in the store) beyond the documented spool bound; one
clear log line for the fault; recovery without anyone doing anything.

Kinds and what stands in for the production case (docs/reliability.md):

- SIGKILL of the daemon at each step of the idle warn -> requeue escalation and of the
  rightsize update of a held pending job (tests/slurm/fault_daemon.py kills it exactly
  there); idle windows are seconds instead of hours, as in test_policy_real.
- slurmctld stopped mid-cycle: 15 s by default, 60 s in the ``slow`` test.
- agents cut off from the daemon: the daemon is stopped for 20 s. At the agents' 1 s
  interval that is 20 batches per node, twice what a 5-minute outage spools at the
  production 30 s interval; the spool bound (64 MiB) is not reached either way.
- the database on a small tmpfs, filled up and then remounted read-only; and on an
  ext4 loop image that an ext4 error turns read-only under the running daemon.
- a restart with a broken config (three kinds of breakage).

The tally of injected faults prints at the end of the module.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.store import open_store, schema
from tests.configs import QUICK_IDLE_ENFORCE, QUICK_POLICY, config_toml, observing
from tests.polling import wait_for
from tests.slurm.harness import NODES, Telemetry, listed_job, running_stack

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "kills and restarts its lab's daemons: the site lab is the session's, shared"

FAULTS: Counter[str] = Counter()  # kind -> faults injected and survived

IDLE = config_toml(QUICK_POLICY, QUICK_IDLE_ENFORCE, observing("rightsize"))

RIGHTSIZE = config_toml(
    QUICK_POLICY, observing("idle_gpu"), {"policy.rightsize": {"mode": "enforce"}}
)


@pytest.fixture(scope="module", autouse=True)
def fault_report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not FAULTS:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line("")
        for kind, n in sorted(FAULTS.items()):
            reporter.write_line(f"faults: {kind:<44} injected and survived {n}")


# --------------------------------------------------------------------------- helpers


def audit(t: Telemetry, job_id: int, policy: str) -> list[tuple[str, str, str]]:
    rows: list[dict[str, Any]] = json.loads(t.run("actions", "--json", "--job", str(job_id)))
    return [
        (r["kind"], r["outcome"], r["error"] or "") for r in reversed(rows) if r["policy"] == policy
    ]


def daemon_log(t: Telemetry) -> str:
    return (t.tmp / "daemon.log").read_text()


def kill_daemon_at(t: Telemetry, point: str) -> str:
    """Run the daemon until it SIGKILLs itself at ``point``; return the marker text."""
    return t.run_daemon_until_killed("fault_daemon", point, 150)


def gpu0_sequences(t: Telemetry) -> dict[str, list[int]]:
    """Per node, the agent sequence numbers stored for GPU 0 (sampled every cycle)."""
    store = open_store(t.db, migrate=False)
    s = schema.samples
    out: dict[str, list[int]] = {}
    with store.engine.connect() as conn:
        for (uid,) in conn.execute(select(s.c.sample_uid).where(s.c.kind == "gpu")):
            node, run, seq, gpu, _job = uid.split(":")
            if gpu == "0":
                out.setdefault(f"{node}:{run}", []).append(int(seq))
    return {k: sorted(v) for k, v in out.items()}


def assert_no_samples_lost(t: Telemetry) -> int:
    """Every agent run's GPU-0 samples form one contiguous sequence; return how many."""
    total = 0
    for run, seqs in gpu0_sequences(t).items():
        missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))
        assert not missing, f"{run}: samples lost, sequence numbers {missing[:10]}"
        total += len(seqs)
    return total


def assert_agents_drained(t: Telemetry) -> None:
    for node in NODES:
        wait_for(f"agent {node}'s spool to drain", partial(spool_empty, t, node), 120)
    for node in NODES:
        dropped = t.tmp / f"spool-{node}" / "dropped_samples"
        assert not dropped.exists() or dropped.read_text().strip() == "0", f"{node} dropped"


def elapse(what: str, seconds: float) -> None:
    """Let ``seconds`` of daemon cycles pass (polling, so a failure still shows at once)."""
    start = time.monotonic()
    wait_for(what, lambda: time.monotonic() - start >= seconds, seconds + 30)


def spool_empty(t: Telemetry, node: str) -> bool:
    return not list((t.tmp / f"spool-{node}").glob("*.batch"))


def samples_arriving(t: Telemetry) -> None:
    before = t.usage().count_samples()
    wait_for("new samples to arrive", lambda: t.usage().count_samples() > before, 60)


def one_line(text: str, pattern: str) -> None:
    lines = [ln for ln in text.splitlines() if re.search(pattern, ln)]
    assert len(lines) == 1, f"expected one line matching {pattern!r}, got {lines}"


# --------------------------------------------------------------------------- SIGKILL

IDLE_POINTS = [
    "after_record:warn",
    "after_outcome:warn",
    "after_record:requeue",
    "after_execute:requeue",
    "after_outcome:requeue",
]


@pytest.mark.parametrize("point", IDLE_POINTS)
def test_daemon_killed_during_idle_warn_then_requeue(
    slurm_cluster: LabCluster, tmp_path: Path, point: str
) -> None:
    with running_stack(slurm_cluster, tmp_path, IDLE) as t:
        t.stop_daemon()
        job = t.submit(
            "--requeue",
            "--gres=gpu:1",
            "-w",
            "gpu1",
            "--wrap",
            t.fakeload("--util", "0", "--mem", "1GiB", "--duration", "600s"),
        )
        assert kill_daemon_at(t, point).split() == [point, str(job)]
        t.start_daemon()
        wait_for(
            "the requeue to show in Slurm",
            lambda: (j := listed_job(job)) is not None and j.restart_count >= 1,
            120,
        )
        elapse("five daemon cycles after the requeue", 5)
        # Acted on once: one requeue in Slurm, one requeue that took effect in the audit.
        j = listed_job(job)
        assert j is not None, "the job was lost"
        assert j.restart_count == 1, f"requeued {j.restart_count} times"
        assert j.state.value == "PENDING" and "Held" not in j.reason, j.reason
        rows = audit(t, job, "idle_gpu")
        # One requeue took effect, in the audit too: the one Slurm made before the kill
        # is confirmed after the restart ("taken"), the one it never got is redone.
        effective = [r for r in rows if r[0] == "requeue" and r[1] == "done"]
        interrupted = [r for r in rows if "interrupted" in r[2]]
        assert len(effective) == 1, rows
        assert ("warn", "notified", "") in rows, rows
        left_pending = point.startswith(("after_record", "after_execute"))
        assert len(interrupted) == (1 if left_pending else 0), rows
        if point == "after_execute:requeue":
            assert interrupted[0][:2] == ("requeue", "done"), rows
            assert "taken (confirmed after restart)" in interrupted[0][2], rows
        elif point == "after_record:requeue":
            assert interrupted[0][:2] == ("requeue", "failed"), rows
            assert "not applied" in interrupted[0][2], rows
        text = daemon_log(t)
        assert "Traceback" not in text
        if left_pending:
            one_line(text, r"interrupted by a daemon stop, checked in Slurm")
        one_line(text, r"took over the daemon lease .*is gone")
        assert t.daemon is not None and t.daemon.poll() is None
        FAULTS[f"SIGKILL daemon, idle {point}"] += 1


RIGHTSIZE_POINTS = ["after_record:update", "after_execute:update", "after_outcome:update"]


def test_daemon_killed_during_rightsize_update_of_a_held_pending_job(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with running_stack(slurm_cluster, tmp_path, RIGHTSIZE) as t:
        history = [
            t.submit("-J", "rs-fault", "-t", "10:00:00", "--mem=2000", "--wrap", "sleep 3")
            for _ in range(3)
        ]

        def summarised() -> bool:
            return all(t.usage().summary(h) is not None for h in history)

        wait_for("three finished runs with summaries", summarised, 150)
        t.stop_daemon()
        for point in RIGHTSIZE_POINTS:
            job = t.submit(
                "--hold",
                "--comment",
                "sgpu:rightsize",
                "-J",
                "rs-fault",
                "-t",
                "10:00:00",
                "--mem=2000",
                "--wrap",
                "sleep 1",
            )
            assert kill_daemon_at(t, point).split() == [point, str(job)]
            t.start_daemon()

            def settled(job: int = job) -> list[tuple[str, str, str]] | None:
                rows = audit(t, job, "rightsize")
                return rows if any(r[1] == "done" or "interrupted" in r[2] for r in rows) else None

            wait_for("the rightsize decision to settle", settled, 60)
            elapse("five more daemon cycles", 5)
            rows = audit(t, job, "rightsize")
            # The update Slurm made before the kill is confirmed after the restart (the
            # new limit is in place) and counts; the one it never got is decided again.
            changes = sum(1 for r in rows if r[0] == "update" and r[1] == "done")
            if point == "after_record:update":
                assert ("update", "done", "") in rows, rows  # decided again and applied once
                assert any("not applied" in r[2] for r in rows), rows
            if point == "after_execute:update":
                assert any("taken (confirmed after restart)" in r[2] for r in rows), rows
            assert changes == 1, f"{point}: the job was changed {changes} times: {rows}"
            j = listed_job(job)
            assert j is not None and j.state.value == "PENDING", "the job was lost"
            assert j.time_limit is not None and j.time_limit.total_seconds() < 36000
            assert "JobHeldUser" in j.reason, f"the user's hold must stay: {j.reason}"
            subprocess.run(["scancel", str(job)], check=False, timeout=30)
            t.stop_daemon()
            FAULTS[f"SIGKILL daemon, rightsize {point}"] += 1
        t.start_daemon()  # running_stack stops it
        assert "Traceback" not in daemon_log(t)


# --------------------------------------------------------------------------- restarts


BROKEN = {
    "not TOML": "[daemon\npoll_interval = 30s\n",
    "bad duration": '[daemon]\npoll_interval = "soon"\n',
    "unknown key": '[policy.idle_gpu]\nwarn_afterr = "1h"\n',
}


def test_restart_with_a_broken_config_refuses_in_one_line_and_loses_nothing(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with running_stack(slurm_cluster, tmp_path) as t:
        job = t.submit(
            "--gres=gpu:1",
            "--wrap",
            t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "300s"),
        )
        samples_arriving(t)
        config = tmp_path / "config.toml"
        good = config.read_text()
        t.stop_daemon()
        for what, text in BROKEN.items():
            config.write_text(good + text if what == "unknown key" else text)
            proc = subprocess.run(
                t.sgpu("daemon", "--interval", "1s", "--listen", f"127.0.0.1:{t.port}"),
                env=t.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert proc.returncode == 3, f"{what}: exit {proc.returncode}: {proc.stderr}"
            errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert len(errors) == 1 and errors[0].startswith("sgpu: config error in "), errors
            assert re.search(r"line \d+", errors[0]), errors[0]
            FAULTS[f"restart with a broken config ({what})"] += 1
        config.write_text(good)
        t.start_daemon()
        assert_agents_drained(t)
        samples_arriving(t)
        assert assert_no_samples_lost(t) > 0
        j = listed_job(job)
        assert j is not None and j.state.value == "RUNNING"
        (row,) = open_store(t.db, migrate=False).jobs(job_ids=[job])
        assert not row.gone


def test_agents_cut_off_from_the_daemon_spool_and_resend_everything(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    outage_s = 20.0
    with running_stack(slurm_cluster, tmp_path) as t:
        t.submit(
            "--gres=gpu:1",
            "--wrap",
            t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "300s"),
        )
        samples_arriving(t)
        t.stop_daemon()
        down_at = time.monotonic()
        wait_for(
            "the agents to spool batches",
            lambda: all(len(list((t.tmp / f"spool-{n}").glob("*.batch"))) >= 3 for n in NODES),
            60,
        )
        wait_for(
            f"{outage_s:.0f}s of outage",
            lambda: time.monotonic() - down_at >= outage_s,
            outage_s + 10,
        )
        spooled = sum(len(list((t.tmp / f"spool-{n}").glob("*.batch"))) for n in NODES)
        assert spooled >= 4 * (outage_s - 5)
        t.start_daemon()
        assert_agents_drained(t)
        assert assert_no_samples_lost(t) > 4 * outage_s
        for node in NODES:
            log = (t.tmp / f"agent-{node}.log").read_text()
            assert "Traceback" not in log
        FAULTS["agents cut off from the daemon (20 s)"] += 1


# --------------------------------------------------------------------------- slurmctld


def _ctld_outage(slurm_cluster: LabCluster, tmp_path: Path, outage_s: float) -> None:
    with running_stack(slurm_cluster, tmp_path) as t:
        running = t.submit(
            "--gres=gpu:1",
            "--wrap",
            t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "600s"),
        )
        pending = t.submit("-N", "4", "--gres=gpu:4", "--begin=now+1hour", "--wrap", "true")
        wait_for(
            "the daemon to record both jobs",
            lambda: len(open_store(t.db, migrate=False).jobs(job_ids=[running, pending])) == 2,
            60,
        )
        samples_arriving(t)
        slurm_cluster.stop_ctld()
        down_at = time.monotonic()
        try:
            wait_for("the daemon to notice", lambda: "slurm unavailable" in daemon_log(t), 60)
            samples_arriving(t)  # the agents' samples keep coming in while Slurm is away
            wait_for(
                f"{outage_s:.0f}s of outage",
                lambda: time.monotonic() - down_at >= outage_s,
                outage_s + 30,
            )
            assert t.daemon is not None and t.daemon.poll() is None
        finally:
            slurm_cluster.start_ctld()
        wait_for("the daemon to recover", lambda: "slurm reachable again" in daemon_log(t), 120)
        text = daemon_log(t)
        unavailable = [
            ln for ln in text.splitlines() if "slurm unavailable" in ln and "WARNING" in ln
        ]
        assert 1 <= len(unavailable) <= 2, unavailable  # one per outage (two error texts)
        one_line(text, "slurm reachable again")
        store = open_store(t.db, migrate=False)
        for job_id in (running, pending):
            (row,) = store.jobs(job_ids=[job_id])
            assert not row.gone
            assert all(e["kind"] not in {"gone", "vanished"} for e in store.events(job_id))
        assert_agents_drained(t)
        assert_no_samples_lost(t)
        FAULTS[f"slurmctld stopped mid-cycle ({outage_s:.0f} s)"] += 1


def test_slurmctld_stopped_for_15_s(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    _ctld_outage(slurm_cluster, tmp_path, 15.0)


@pytest.mark.slow
def test_slurmctld_stopped_for_60_s(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    _ctld_outage(slurm_cluster, tmp_path, 60.0)


# --------------------------------------------------------------------------- the database


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if proc.returncode != 0:
        reason = f"cannot mount a tmpfs here: {proc.stderr.strip()}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def test_database_disk_full_then_read_only_then_recovered(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with running_stack(slurm_cluster, tmp_path) as t, tmpfs(tmp_path / "dbfs", "64m") as mnt:
        t.stop_daemon()
        filler = mnt / "filler"
        filler.touch()  # made before the store writes there: nothing of it can fail later
        t.db = f"sqlite:///{mnt / 'state.db'}"
        t.env["SGPU_DB"] = t.db
        t.run("db", "upgrade")
        t.start_daemon()
        job = t.submit(
            "--gres=gpu:1",
            "--wrap",
            t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "600s"),
        )
        samples_arriving(t)
        # Fill what the store left. ENOSPC is suppressed around the file, not inside it:
        # twice on a loaded machine it was raised at the `with` itself (the old open
        # with O_CREAT|O_TRUNC, or the buffered close() flushing after the failed
        # write), outside the suppress. Unbuffered, close() has nothing to flush.
        with contextlib.suppress(OSError), filler.open("r+b", buffering=0) as f:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
                os.fsync(f.fileno())
        wait_for("the daemon to report the full disk", lambda: problems(t, "disk is full"), 60)
        wait_for(
            "the agents to spool",
            lambda: any((t.tmp / f"spool-{n}").glob("*.batch") for n in NODES),
            60,
        )
        elapse("10 s of a full disk", 10)
        assert t.daemon is not None and t.daemon.poll() is None
        full = problems(t, "disk is full")
        # One line per writer that met the full disk (ingest, observe cycle, lease), not
        # one per request or cycle.
        assert 1 <= len(full) <= 4, full
        filler.unlink()
        FAULTS["database disk full (daemon running)"] += 1
        wait_for("ingest to work again", lambda: "ingest works again" in daemon_log(t), 120)
        assert_agents_drained(t)
        # Read-only: Linux will not remount a file system read-only under an open writer,
        # so the daemon stops (as for maintenance), the database's file system goes
        # read-only, and a supervisor (systemd Restart=on-failure, played here) keeps
        # starting the daemon; it must refuse in one line each time, then run again once
        # the file system is writable.
        t.stop_daemon()
        gc.collect()  # this test's own store engines hold the file open too
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, timeout=30)
        refusals: list[str] = []
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                proc = subprocess.run(
                    t.sgpu("daemon", "--interval", "1s", "--listen", f"127.0.0.1:{t.port}"),
                    env=t.env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert proc.returncode in (1, 4), proc.stderr
                assert "Traceback" not in proc.stderr, proc.stderr
                lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("sgpu:")]
                assert len(lines) == 1, proc.stderr
                refusals.append(lines[0])
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True, timeout=30)
        assert refusals and all("read" in r.lower() for r in refusals), refusals
        FAULTS["database read-only (daemon restarts)"] += len(refusals)
        t.start_daemon()
        assert_agents_drained(t)
        samples_arriving(t)
        assert assert_no_samples_lost(t) > 0
        assert listed_job(job) is not None
        assert "Traceback" not in daemon_log(t)
        t.stop_daemon()  # before the tmpfs goes away
        t.daemon = None


@contextlib.contextmanager
def ext4(
    path: Path, size_mib: int
) -> Iterator[tuple[Path, Callable[[], None], Callable[[], None]]]:
    """A mounted ext4 loop image (``errors=remount-ro``), with ``fail`` (an ext4 error:
    the kernel remounts it read-only under open files, as for a failing disk) and
    ``repair`` (unmount, fsck, mount again: what the operator does)."""
    image, mnt = path.with_suffix(".img"), path
    mnt.mkdir()
    with image.open("wb") as f:
        f.truncate(size_mib << 20)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)

    def mount() -> str:
        proc = run("mount", "-o", "loop,errors=remount-ro", str(image), str(mnt))
        if proc.returncode != 0:
            reason = f"cannot mount an ext4 loop image here: {proc.stderr.strip()}"
            print(f"\n{reason}", file=sys.stderr)
            pytest.skip(reason)
        return Path(run("findmnt", "-n", "-o", "SOURCE", str(mnt)).stdout.strip()).name

    made = run("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    device = [mount()]

    def fail() -> None:
        Path(f"/sys/fs/ext4/{device[0]}/trigger_fs_error").write_text("slurmgpu fault test\n")

    def repair() -> None:
        for _ in range(10):
            gc.collect()  # this test's own store engines hold the file open too
            if run("umount", str(mnt)).returncode == 0:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"{mnt} stays busy: {run('fuser', '-vm', str(mnt)).stderr}")
        fsck = run("e2fsck", "-fy", str(image))
        assert fsck.returncode in (0, 1), fsck.stdout + fsck.stderr  # 1: errors corrected
        device[0] = mount()

    try:
        yield mnt, fail, repair
    finally:
        if run("findmnt", str(mnt)).returncode == 0:
            run("umount", "-l", str(mnt))


def test_database_read_only_under_the_running_daemon(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with (
        running_stack(slurm_cluster, tmp_path) as t,
        ext4(tmp_path / "dbdisk", 64) as (mnt, fail, repair),
    ):
        t.stop_daemon()
        t.db = f"sqlite:///{mnt / 'state.db'}"
        t.env["SGPU_DB"] = t.db
        t.run("db", "upgrade")
        t.start_daemon()
        job = t.submit(
            "--gres=gpu:1",
            "--wrap",
            t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "600s"),
        )
        samples_arriving(t)
        fail()  # from here the test reads nothing from the database until it is repaired
        # A listing that changed gives the observe cycle something to store (one where
        # nothing changed writes nothing, so it would not meet the read-only disk).
        subprocess.run(
            [slurm_cluster.command("sbatch"), "-o", "/dev/null", "--wrap", "sleep 600"],
            env={**os.environ, **slurm_cluster.env()},
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(
            "the daemon to report the read-only disk",
            lambda: problems(t, "could not store the observe cycle"),
            60,
        )
        wait_for(
            "the agents to spool",
            lambda: any((t.tmp / f"spool-{n}").glob("*.batch") for n in NODES),
            60,
        )
        elapse("15 s of a read-only database", 15)
        assert t.daemon is not None and t.daemon.poll() is None, "the daemon died"
        text = daemon_log(t)
        assert "Traceback" not in text
        # One line per writer that met the read-only disk (observe cycle, ingest, lease).
        cycle = problems(t, "could not store the observe cycle")
        assert len(cycle) == 1, problems(t, "")
        assert 1 <= len(problems(t, "ingest from")) <= 2, problems(t, "")
        FAULTS["database read-only (daemon running)"] += 1
        t.stop_daemon()  # the operator's turn: stop, fsck, remount, start
        repair()
        t.start_daemon()
        assert_agents_drained(t)
        samples_arriving(t)
        assert assert_no_samples_lost(t) > 0
        assert listed_job(job) is not None
        assert "Traceback" not in daemon_log(t)
        t.stop_daemon()  # before the file system goes away
        t.daemon = None


def problems(t: Telemetry, text: str) -> list[str]:
    """The daemon's WARNING/ERROR lines that mention ``text``."""
    return [
        ln
        for ln in daemon_log(t).splitlines()
        if (" WARNING " in ln or " ERROR " in ln) and text in ln
    ]
