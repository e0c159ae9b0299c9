"""``sgpu launch`` with real torchrun and real signals (no Slurm: squeue and scontrol are
stand-ins on PATH that answer like Slurm's and record their calls).

The checkpoint signal reaches the workers, which checkpoint and acknowledge, while
torchrun (which dies of SIGUSR2 by default) survives it; SIGTERM ends the whole tree; at
the time limit the launcher requeues the job after the acknowledgement; a command's
leftovers (a process in its own session that ignores SIGTERM) do not outlive it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from slurmgpu.elastic.launcher import catches, tree
from slurmgpu.elastic.spec import read_ack
from tests.polling import wait_for
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _fake_slurm(bin_dir: Path, time_left: str) -> Path:
    """squeue answering ``%L`` with ``time_left``; scontrol recording its arguments."""
    calls = bin_dir / "scontrol.calls"
    bin_dir.mkdir()
    for name, body in (
        ("squeue", f'echo "{time_left}"\n'),
        ("scontrol", f'echo "$@" >> {calls}\n'),
    ):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return calls


class Launched:
    def __init__(self, tmp: Path, time_left: str, grace: int = 30) -> None:
        self.tmp = tmp
        self.calls = _fake_slurm(tmp / "bin", time_left)
        self.log = tmp / "steps.log"
        env = {
            **os.environ,
            "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "SLURM_JOB_ID": "77",
            "SGPU_ELASTIC_DIR": str(tmp / "state"),
            "SGPU_CHECKPOINT_HOLD": str(grace),
            "SGPU_LAUNCH_TERM_WAIT": "5",
            "LAUNCH_TEST_LOG": str(self.log),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            sys.executable, "-m", "slurmgpu", "launch", "--",
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}",
            str(ROOT / "tests" / "unit" / "launch_worker.py"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, cwd=tmp, stderr=subprocess.PIPE)

    def ranks_training(self) -> bool:
        if not self.log.exists():
            return False
        return {line.split()[0] for line in self.log.read_text().splitlines()} == {"0", "1"}

    def events(self) -> list[dict[str, object]]:
        path = self.tmp / "state" / "77" / "launch.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for p in psutil.process_iter():
            try:
                if p.environ().get("LAUNCH_TEST_LOG") == str(self.log):  # this test's only
                    p.kill()
            except psutil.Error:
                continue


@pytest.fixture
def launched(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Launched]:
    pytest.importorskip("torch", reason="torchrun needs torch (pip install torch==2.13.0)")
    time_left = getattr(request, "param", "2:00:00")
    job = Launched(tmp_path, time_left)
    try:
        yield job
    finally:
        job.stop()


def _processes(job: Launched) -> list[psutil.Process]:
    return tree(job.proc.pid)


@pytest.mark.slow
def test_the_checkpoint_signal_reaches_the_workers_and_torchrun_survives_it(
    launched: Launched,
) -> None:
    wait_for("both ranks training", launched.ranks_training, timeout_s=120)
    procs = _processes(launched)
    torchrun = procs[0]
    assert "torch.distributed.run" in " ".join(torchrun.cmdline())
    assert not catches(torchrun.pid, signal.SIGUSR2)  # it would die of it
    workers = [p for p in procs if p.ppid() == torchrun.pid]
    assert len(workers) == 2 and all(catches(p.pid, signal.SIGUSR2) for p in workers)

    launched.proc.send_signal(signal.SIGUSR2)
    ack = wait_for("the acknowledgement", lambda: read_ack(launched.tmp / "state", 77))
    assert ack.acks == 1
    relayed = next(e for e in launched.events() if e["event"] == "checkpoint_signal")
    targets = relayed["relayed_to"]
    assert isinstance(targets, list) and sorted(targets) == sorted(p.pid for p in workers)
    assert torchrun.is_running() and launched.proc.poll() is None
    assert not launched.calls.exists()  # not the time limit: the daemon requeues

    launched.proc.send_signal(signal.SIGTERM)  # the requeue
    launched.proc.wait(timeout=60)
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
@pytest.mark.parametrize("launched", ["1:00"], indirect=True)
def test_at_the_time_limit_the_launcher_requeues_after_the_checkpoint(
    launched: Launched,
) -> None:
    wait_for("both ranks training", launched.ranks_training, timeout_s=120)
    procs = _processes(launched)
    launched.proc.send_signal(signal.SIGUSR2)  # --signal=B:USR2@grace: the batch shell only
    wait_for("the requeue", launched.calls.exists)
    assert launched.calls.read_text().split() == ["requeue", "77"]
    ack = read_ack(launched.tmp / "state", 77)
    assert ack is not None and ack.acks == 1  # requeued only once the checkpoint was durable
    launched.proc.send_signal(signal.SIGTERM)  # what Slurm does next
    launched.proc.wait(timeout=60)
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow  # runs sgpu launch as a separate process
def test_no_process_of_the_command_outlives_it(tmp_path: Path) -> None:
    """The command exits, leaving a process in its own session that ignores SIGTERM."""
    pidfile = tmp_path / "straggler.pid"
    straggler = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(pidfile)!r} + '.tmp', 'w').write(str(os.getpid())); "
        f"os.rename({str(pidfile)!r} + '.tmp', {str(pidfile)!r}); time.sleep(600)"
    )
    code = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {straggler!r}], start_new_session=True)\n"
        f"while not os.path.exists({str(pidfile)!r}): time.sleep(0.01)\n"  # SIGTERM ignored
        "sys.exit(5)\n"
    )
    env = {
        **os.environ,
        "SLURM_JOB_ID": "78",
        "SGPU_ELASTIC_DIR": str(tmp_path / "state"),
        "SGPU_LAUNCH_TERM_WAIT": "1",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgpu", "launch", "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 5, proc.stderr
    pid = int(pidfile.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    events = [
        json.loads(x) for x in (tmp_path / "state" / "78" / "launch.jsonl").read_text().splitlines()
    ]
    cleaned = next(e for e in events if e["event"] == "cleaned_up")
    assert cleaned["killed"] == [pid]


@pytest.mark.parametrize(("in_step", "nodes"), [(False, 2), (True, 2), (False, 1)])
def test_the_batch_launcher_of_a_multinode_job_signals_the_steps_and_alone_requeues(
    tmp_path: Path, in_step: bool, nodes: int
) -> None:
    """The time limit's signal reaches only the batch launcher: with several nodes it
    sends it on to the job's steps (each node's launcher); a launcher inside a step
    neither does that nor requeues (one requeue per job, not per node)."""
    from slurmgpu.elastic.launcher import Launcher

    relayed: list[tuple[int, int]] = []

    def signal_steps(job_id: int, signum: int) -> str | None:
        relayed.append((job_id, signum))
        return None

    launcher = Launcher(
        command=["sleep", "30"],
        job_id=9,
        state_dir=tmp_path,
        env={"PATH": os.environ["PATH"], "SLURM_JOB_NODELIST": "gpu[1-2]"},
        time_left=lambda job_id: 30.0,  # inside the grace: the time limit's signal
        in_step=in_step,
        nodes=nodes,
        signal_steps=signal_steps,
        find_head=lambda env: "10.0.0.1",
    )
    launcher.start()
    try:
        launcher._handle(signal.SIGUSR2)
    finally:
        assert launcher._child is not None
        launcher._child.kill()
        launcher._child.wait()
    events = [json.loads(x)["event"] for x in launcher.log_path.read_text().splitlines()]
    assert relayed == ([] if in_step or nodes == 1 else [(9, signal.SIGUSR2)])
    assert ("time_limit" in events) is not in_step
    assert ("relayed_to_steps" in events) is (not in_step and nodes > 1)
    start = json.loads(launcher.log_path.read_text().splitlines()[0])
    assert start["event"] == "start"


def test_the_batch_launcher_exports_the_head_nodes_address(tmp_path: Path) -> None:
    from slurmgpu.elastic.launcher import Launcher

    script = 'echo "$SGPU_HEAD_ADDR" > "$0"'
    for nodes, in_step, expected in (
        (2, False, "10.0.0.1"),
        (1, False, "127.0.0.1"),
        (2, True, ""),
    ):
        out = tmp_path / f"head-{nodes}-{in_step}"
        launcher = Launcher(
            command=["/bin/sh", "-c", script, str(out)],
            job_id=9,
            state_dir=tmp_path,
            env={"PATH": os.environ["PATH"]},
            in_step=in_step,
            nodes=nodes,
            find_head=lambda env: "10.0.0.1",
        )
        launcher.start()
        assert launcher._child is not None
        launcher._child.wait(timeout=30)
        assert out.read_text().strip() == expected


def test_without_scontrol_the_head_is_this_hosts_address(tmp_path: Path) -> None:
    """The batch shell runs on the allocation's first node: when scontrol cannot say the
    node's NodeAddr (not on PATH here), this host's own address stands in."""
    import socket as socket_module

    from slurmgpu.elastic.launcher import head_address

    env = {"SLURM_JOB_NODELIST": "gpu[1-2]", "PATH": str(tmp_path)}
    old = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)  # no scontrol
    try:
        got = head_address(env)
    finally:
        os.environ["PATH"] = old
    assert got == socket_module.gethostbyname(socket_module.gethostname())


@pytest.mark.parametrize(
    ("step_id", "expected"),
    [(None, False), ("-5", False), ("4294967291", False), ("0", True), ("3", True), ("x", False)],
)
def test_a_step_task_is_told_from_the_batch_script(step_id: str | None, expected: bool) -> None:
    """22.05's batch script has no SLURM_STEP_ID, 26.05's has -5 (its batch step's id);
    srun's tasks have 0, 1, ..."""
    from slurmgpu.elastic.launcher import in_step

    env = {} if step_id is None else {"SLURM_STEP_ID": step_id}
    assert in_step(env) is expected


def test_a_job_shrunk_in_place_gets_its_command_again_on_the_nodes_kept(
    tmp_path: Path,
) -> None:
    """The daemon's NumNodes= on the running job and TERM to its steps end the command;
    the batch launcher sees the job running on fewer nodes and starts the command again
    with Slurm's variables for the nodes kept. The second end is the job's own."""
    from slurmgpu.elastic.launcher import Launcher

    out = tmp_path / "runs"
    answers = [("RUNNING", 1, "gpu1"), ("RUNNING", 1, "gpu1")]
    launcher = Launcher(
        command=["/bin/sh", "-c", 'echo "$SLURM_NNODES $SLURM_JOB_NODELIST" >> "$0"', str(out)],
        job_id=9,
        state_dir=tmp_path,
        env={"PATH": os.environ["PATH"], "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[1-2]"},
        nodes=2,
        find_head=lambda env: "10.0.0.1",
        job_nodes=lambda job_id: answers.pop(0) if answers else None,
    )
    assert launcher.run() == 0
    assert out.read_text().splitlines() == ["2 gpu[1-2]", "1 gpu1"]
    events = [json.loads(x) for x in launcher.log_path.read_text().splitlines()]
    shrunk = [e for e in events if e["event"] == "shrunk_in_place"]
    assert [(e["nodes"], e["was"]) for e in shrunk] == [(1, 2)]
    assert [e["event"] for e in events].count("start") == 2
    assert answers == [("RUNNING", 1, "gpu1")]  # one node now: no more questions


def test_a_command_that_ends_on_all_its_nodes_is_not_started_again(tmp_path: Path) -> None:
    from slurmgpu.elastic.launcher import Launcher

    asked: list[int] = []

    def job_nodes(job_id: int) -> tuple[str, int, str]:
        asked.append(job_id)
        return ("RUNNING", 2, "gpu[1-2]")  # still on both: the command ended by itself

    launcher = Launcher(
        command=["/bin/sh", "-c", "exit 3"],
        job_id=9,
        state_dir=tmp_path,
        env={"PATH": os.environ["PATH"]},
        nodes=2,
        find_head=lambda env: "10.0.0.1",
        job_nodes=job_nodes,
    )
    assert launcher.run() == 3
    assert asked == [9]


@pytest.mark.slow  # runs sgpu launch as a separate process, ~1 s
def test_a_checkpoint_signal_while_the_launcher_starts_or_exits_never_kills_the_job(
    tmp_path: Path,
) -> None:
    """The batch script as ``sgpu submit --malleable`` writes it, under a stream of
    checkpoint signals from its first millisecond to its exit: the interpreter's start
    (the trap in front of ``exec``) and its exit (ignored once the command is over) are
    covered, so the job ends with its command's status. The trace replay (issue 33) lost
    jobs in both windows: a resize decided 0.3 s after a job started, and one decided as
    it ended, each killed by SIGUSR2 (Slurm: FAILED)."""
    from slurmgpu.cli.launchwrap import wrap_command

    script = wrap_command("sleep 1", "USR2")
    env = {
        **os.environ,
        "SLURM_JOB_ID": "79",
        "SGPU_ELASTIC_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(["/bin/sh", "-c", script], env=env, stderr=subprocess.PIPE)
    # from the exec on (the shell has run its trap): the interpreter's start-up follows
    # (the command line reads empty for an instant while the kernel swaps the image)
    wait_for("the exec", lambda: psutil.Process(proc.pid).cmdline()[:1] not in ([], ["/bin/sh"]))
    sent = 0
    while proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR2)
            sent += 1
        time.sleep(0.05)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert sent > 5
    events = [
        json.loads(x)["event"]
        for x in (tmp_path / "state" / "79" / "launch.jsonl").read_text().splitlines()
    ]
    assert events[0] == "start" and events[-1] == "exit"
