"""The node agent end to end: simulated GPUs, a real fakeload process, real HTTP to a fake daemon.

The fake daemon (``tests/fakedaemon.py``) serves the daemon's two agent endpoints on
127.0.0.1 and authenticates with ``wire.verify_hmac`` / ``wire.verify_munge``; "daemon
down" is its socket closed, so the agent sees a real connection refused.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.agent.loop import CycleReport
from slurmgpu.agent.sender import (
    AgentAuthError,
    Backoff,
    DaemonClient,
    HmacAuth,
    SendOutcome,
    choose_auth,
    read_node_token,
)
from slurmgpu.telemetry.simgpu import declaration_path
from slurmgpu.wire import NodeJob, SampleBatch, munge_available, node_token, verify_hmac
from tests.fakedaemon import FakeDaemon
from tests.polling import wait_for
from tests.unit.agent_rig import DEADLINE_S, NODE, SECRET, gres_conf, make_loop, sim_dir

__all__ = ["gres_conf", "sim_dir"]  # fixtures, used by name

JOB = 987_654  # unlikely to collide with a real job on the machine running the tests
OTHER_JOB = 987_655
DECLARED_UTIL = 70.0
DECLARED_MEM_MIB = 2048
REPO = Path(__file__).resolve().parents[2]

# -- fixtures -------------------------------------------------------------------------


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    fake = FakeDaemon(
        SECRET,
        jobs={
            NODE: [
                NodeJob(job_id=JOB, gpu_indices=[0, 1], shard_indices=[], shards=0, cpus=4),
                NodeJob(job_id=OTHER_JOB, gpu_indices=[], shard_indices=[], shards=0, cpus=1),
            ]
        },
    ).start()
    yield fake
    fake.stop()


def _job_env(job_id: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_"))}
    env["SLURM_JOB_ID"] = str(job_id)
    return env


@pytest.fixture
def fakeload(sim_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``sgpu fakeload`` in job JOB declaring DECLARED_UTIL on Slurm GPU 0."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmgpu.cli.fakeload",
            "--state-dir",
            str(sim_dir),
            "--node",
            NODE,
            "--devices",
            "0",
            "--util",
            str(DECLARED_UTIL),
            "--mem",
            f"{DECLARED_MEM_MIB}MiB",
            "--interval",
            "5s",
        ],
        env=_job_env(JOB),
        stdin=subprocess.DEVNULL,
    )
    wait_for(
        "the fakeload declaration",
        lambda: declaration_path(sim_dir, NODE, proc.pid, 0).exists() or proc.poll() is not None,
    )
    assert proc.poll() is None, "fakeload exited early"
    yield proc
    proc.terminate()
    proc.wait(timeout=DEADLINE_S)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "node.token"
    path.write_text(node_token(SECRET, NODE).hex() + "\n")
    path.chmod(0o600)
    return path


def _seq(uid: str) -> int:
    return int(uid.split(":")[2])


def _run_id(uid: str) -> str:
    return uid.split(":")[1]


def _batch_seq(batch: SampleBatch) -> int:
    seqs = {_seq(uid) for uid in _all_uids([batch])}
    assert len(seqs) == 1, "one batch holds one cycle"
    return seqs.pop()


def _all_uids(batches: list[SampleBatch]) -> list[str]:
    return [g.sample_uid for b in batches for g in b.gpu] + [
        h.sample_uid for b in batches for h in b.host
    ]


# -- what a batch says ----------------------------------------------------------------


def test_declared_util_is_charged_to_the_job_on_gpu0_and_gpu1_is_reported_idle(
    daemon: FakeDaemon,
    gres_conf: Path,
    sim_dir: Path,
    tmp_path: Path,
    fakeload: subprocess.Popen[bytes],
) -> None:
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool")
    report = loop.run_once()
    assert report.sent and report.jobs_fresh and not report.spooled

    (batch,) = daemon.accepted()
    assert batch.node == NODE and batch.dropped == 0
    rows = {(s.gpu_index, s.job_id): s for s in batch.gpu}
    busy, idle = rows[(0, JOB)], rows[(1, JOB)]
    assert busy.source == "device" and busy.util_pct == pytest.approx(DECLARED_UTIL)
    assert busy.memory_used_mib == DECLARED_MEM_MIB and busy.processes == 1
    assert (idle.source, idle.util_pct, idle.processes) == ("idle", 0.0, 0)
    # GPUs 2 and 3 belong to no job: still reported, as free devices
    assert {k for k in rows if k[0] in (2, 3)} == {(2, None), (3, None)}
    assert {rows[(2, None)].source, rows[(3, None)].source} == {"device"}

    host = {h.job_id: h for h in batch.host}
    assert host[JOB].cpus_allocated == 4 and (host[JOB].rss_mib or 0) > 0
    assert host[OTHER_JOB].cpus_allocated == 1 and host[OTHER_JOB].rss_mib is None

    uids = _all_uids([batch])
    assert len(uids) == len(set(uids))
    assert all(uid.startswith(f"{NODE}:{loop.sampler.run_id}:1:") for uid in uids)


def test_every_request_is_signed_with_the_node_token(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path
) -> None:
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool")
    assert loop.run_once().sent
    get, post = daemon.requests
    assert (get.method, get.status, post.method, post.status) == ("GET", 200, "POST", 200)
    for request in (get, post):
        caller = verify_hmac(request.authorization, request.body, SECRET)
        assert (caller.node, caller.method) == (NODE, "hmac")


# -- daemon away, daemon back -----------------------------------------------------------


def test_batches_spooled_while_the_daemon_is_down_are_drained_in_order_without_loss(
    daemon: FakeDaemon,
    gres_conf: Path,
    sim_dir: Path,
    tmp_path: Path,
    fakeload: subprocess.Popen[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="slurmgpu.agent")
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool")
    assert loop.run_once().sent
    daemon.stop()
    down = [loop.run_once() for _ in range(4)]
    assert all(r.spooled and not r.sent for r in down)
    assert len(loop.spool) == 4
    # the last job list keeps being used: GPU 1 is still the job's, and idle
    spooled = loop.spool.peek_oldest()
    assert spooled is not None and b'"source":"idle"' in spooled.data

    daemon.start()
    back = loop.run_once()
    assert back.sent and back.drained == 4 and back.spool_batches == 0

    batches = daemon.accepted()
    assert [_batch_seq(b) for b in batches] == [1, 6, 2, 3, 4, 5]  # spooled ones oldest first
    uids = _all_uids(batches)
    assert len(uids) == len(set(uids)) and len(daemon.seen_uids) == len(uids)
    assert all(b.dropped == 0 for b in batches)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("spooling batches" in m for m in messages) == 1
    assert sum("drained 4 spooled batch(es)" in m for m in messages) == 1


def test_a_full_spool_drops_the_oldest_batches_and_reports_how_many_samples(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path
) -> None:
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool", max_batches=2)
    daemon.stop()
    reports: list[CycleReport] = [loop.run_once() for _ in range(4)]
    per_batch = reports[0].gpu_samples + reports[0].host_samples
    assert len(loop.spool) == 2 and loop.spool.dropped_samples == 2 * per_batch
    daemon.start()
    assert loop.run_once().drained == 2
    batches = daemon.accepted()
    assert [_batch_seq(b) for b in batches] == [5, 3, 4]
    assert batches[0].dropped == 2 * per_batch


def test_a_503_keeps_the_batch_for_the_next_cycle(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path
) -> None:
    daemon.script.append((503, "database is busy"))
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool")
    first = loop.run_once()
    assert first.spooled and "database is busy" in first.error
    second = loop.run_once()
    assert second.sent and second.drained == 1
    assert [_batch_seq(b) for b in daemon.accepted()] == [2, 1]


# -- refused for good -----------------------------------------------------------------


def test_a_401_keeps_the_batches_and_a_fixed_token_file_is_picked_up(
    daemon: FakeDaemon,
    gres_conf: Path,
    sim_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A 401/403 may pass (a token being rotated, munged restarting): batches are kept, the
    # credentials re-made after each refusal, and the refusal logged once.
    caplog.set_level(logging.DEBUG, logger="slurmgpu.agent")
    token_file = tmp_path / "node.token"
    token_file.write_text(("77" * 32) + "\n")
    token_file.chmod(0o600)
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool", token=b"w" * 32)
    loop.client.reauth = lambda: choose_auth("hmac", token_file)
    refused = [loop.run_once() for _ in range(3)]
    assert all(r.spooled and not r.rejected for r in refused)
    assert len(loop.spool) == 3
    posts = daemon.posts()
    assert [p.status for p in posts] == [401, 401, 401]
    assert len({p.body for p in posts}) == 3  # three new batches, none sent twice
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 401: bad signature for node agentnode" in errors[0].message

    token_file.write_text(node_token(SECRET, NODE).hex() + "\n")  # the operator fixes it
    fourth = loop.run_once()
    assert fourth.sent and fourth.drained == 3
    assert [_batch_seq(b) for b in daemon.accepted()] == [4, 1, 2, 3]
    assert daemon.accepted()[0].dropped == 0  # nothing was lost
    assert any("takes this node's credentials again" in r.getMessage() for r in caplog.records)


def test_failed_attempts_back_off_with_jitter_and_honour_retry_after(
    daemon: FakeDaemon,
) -> None:
    now = [1000.0]
    client = DaemonClient(
        daemon.url,
        NODE,
        HmacAuth(node_token(SECRET, NODE)),
        timeout_s=5.0,
        backoff=Backoff(base_s=10.0, cap_s=40.0),
        clock=lambda: now[0],
        rng=random.Random(7),
    )
    daemon.script.extend([(503, "database is busy")] * 4)
    waits = []
    for attempt in range(1, 5):
        sent_before = len(daemon.posts())
        result = client.post_samples(b"{}")
        assert result.outcome is SendOutcome.RETRY and result.status == 503
        assert len(daemon.posts()) == sent_before + 1
        wait = client.retry_at - now[0]
        # exponential from 10 s, capped at 40 s, drawn between half and all of it
        full = min(40.0, 10.0 * 2 ** (attempt - 1))
        assert full / 2 <= wait <= full, (attempt, wait)
        waits.append(wait)
        held = client.post_samples(b"{}")  # within the backoff: no request at all
        assert held.outcome is SendOutcome.RETRY and "backing off" in held.error
        assert len(daemon.posts()) == sent_before + 1
        now[0] = client.retry_at
    assert len(set(waits)) == 4  # jittered: no two agents' schedules in step
    # A Retry-After longer than the backoff is honoured.
    client.failures, client.retry_at = 0, 0.0
    daemon.script.append((503, "busy"))
    daemon.retry_after = "120"
    client.post_samples(b"{}")
    assert client.retry_at - now[0] == 120.0


def test_a_token_file_readable_by_others_is_refused_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "node.token"
    path.write_text(node_token(SECRET, NODE).hex())
    path.chmod(0o644)
    with pytest.raises(AgentAuthError, match=r"readable by group or others .*chmod 600"):
        read_node_token(path)
    path.chmod(0o600)
    assert read_node_token(path) == node_token(SECRET, NODE)


def test_connection_refused_is_retryable(tmp_path: Path) -> None:
    probe_server = FakeDaemon(SECRET).start()
    url = probe_server.url
    probe_server.stop()
    result = DaemonClient(url, NODE, HmacAuth(b"t" * 32), timeout_s=2).post_samples(b"{}")
    assert result.outcome is SendOutcome.RETRY and result.unreachable


# -- the command, as a real process ----------------------------------------------------


def _agent_cmd(
    daemon: FakeDaemon,
    gres_conf: Path,
    sim_dir: Path,
    spool_dir: Path,
    token_file: Path,
    *extra: str,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "slurmgpu.cli.agent",
        "--node",
        NODE,
        "--daemon",
        daemon.url,
        "--probe",
        "sim",
        "--sim-dir",
        str(sim_dir),
        "--gres-conf",
        str(gres_conf),
        "--token-file",
        str(token_file),
        "--spool-dir",
        str(spool_dir),
        *extra,
    ]


def test_the_agent_command_stops_cleanly_on_sigterm_and_loses_no_batch(
    daemon: FakeDaemon,
    gres_conf: Path,
    sim_dir: Path,
    tmp_path: Path,
    token_file: Path,
    fakeload: subprocess.Popen[bytes],
) -> None:
    spool_dir = tmp_path / "spool"
    cmd = _agent_cmd(daemon, gres_conf, sim_dir, spool_dir, token_file, "--auth", "hmac")
    proc = subprocess.Popen(
        [*cmd, "--interval", "0.1s"], cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_for("two batches at the daemon", lambda: len(daemon.accepted()) >= 2)
        daemon.stop()
        wait_for("a spooled batch", lambda: any(spool_dir.glob("*.batch")))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.decode()
    log_text = stderr.decode()
    assert log_text.count("spooling batches") == 1 and "Traceback" not in log_text

    daemon.start()
    once = subprocess.run(
        [*cmd, "--once"], cwd=REPO, capture_output=True, timeout=DEADLINE_S, check=False
    )
    assert once.returncode == 0, once.stderr.decode()
    assert b"0 left" in once.stdout
    first_run = _run_id(daemon.accepted()[0].gpu[0].sample_uid)
    seqs = sorted(
        _batch_seq(b) for b in daemon.accepted() if _run_id(b.gpu[0].sample_uid) == first_run
    )
    assert seqs == list(range(1, len(seqs) + 1))  # every cycle of the first run arrived
    uids = _all_uids(daemon.accepted())
    assert len(uids) == len(set(uids))


def test_the_agent_command_refuses_an_open_token_file_in_one_line(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path, token_file: Path
) -> None:
    token_file.chmod(0o640)
    cmd = _agent_cmd(daemon, gres_conf, sim_dir, tmp_path / "spool", token_file, "--once")
    done = subprocess.run(
        [*cmd, "--auth", "hmac"], cwd=REPO, capture_output=True, timeout=DEADLINE_S, check=False
    )
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sgpu: node token file")
    assert "chmod 600" in lines[0]


def test_once_against_a_daemon_that_is_down_spools_and_exits_1(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path, token_file: Path
) -> None:
    daemon.stop()
    spool_dir = tmp_path / "spool"
    cmd = _agent_cmd(daemon, gres_conf, sim_dir, spool_dir, token_file, "--once", "--auth", "hmac")
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=DEADLINE_S, check=False)
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines()[-1].startswith("sgpu: daemon ")
    assert len(list(spool_dir.glob("*.batch"))) == 1


def test_probe_auto_without_nvml_tells_the_user_to_pass_probe_sim(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path, token_file: Path
) -> None:
    from slurmgpu.telemetry.nvml import NvmlProbe
    from slurmgpu.telemetry.probe import ProbeUnavailableError

    try:
        NvmlProbe().close()
    except ProbeUnavailableError:
        pass
    else:
        pytest.skip("NVML works on this machine")
    cmd = _agent_cmd(daemon, gres_conf, sim_dir, tmp_path / "spool", token_file, "--once")
    cmd[cmd.index("sim")] = "auto"
    done = subprocess.run(
        [*cmd, "--auth", "hmac"], cwd=REPO, capture_output=True, timeout=DEADLINE_S, check=False
    )
    assert done.returncode == 1
    (line,) = done.stderr.decode().strip().splitlines()
    assert line.startswith("sgpu: no usable NVIDIA GPU") and "--probe sim" in line


@pytest.mark.skipif(not munge_available(), reason="munged is not running here")
def test_auto_auth_uses_munge_when_munged_answers(
    daemon: FakeDaemon, gres_conf: Path, sim_dir: Path, tmp_path: Path
) -> None:
    missing_token = tmp_path / "absent.token"
    cmd = _agent_cmd(daemon, gres_conf, sim_dir, tmp_path / "spool", missing_token, "--once")
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=DEADLINE_S, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert {r.caller.method for r in daemon.requests if r.caller} == {"munge"}
    assert [r.caller.node for r in daemon.requests if r.caller] == [NODE, NODE]
