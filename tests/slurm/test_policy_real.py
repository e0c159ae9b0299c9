"""Policies end to end on the real local cluster: the daemon, four agents, fakeload jobs.

Idle windows are configured in seconds instead of the production minutes (warn after
4 s, act after 10 s) so the escalation runs within a test; the code path is the same.
Mail goes to a real SMTP server (aiosmtpd) on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.parse import parse_time_limit
from tests.configs import QUICK_IDLE_ENFORCE, QUICK_POLICY, config_toml
from tests.polling import wait_for
from tests.slurm.harness import Telemetry, running_stack

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the stack (harness.running_stack): one agent on each 4-node lab node, gpu1-gpu4"


@dataclass
class Inbox:
    messages: list[tuple[list[str], str]] = field(default_factory=list)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
        self.messages.append((list(envelope.rcpt_tos), text))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[int, Inbox]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, inbox
    finally:
        controller.stop()


def policy_config(smtp_port: int, rightsize_mode: str) -> str:
    return config_toml(
        QUICK_POLICY,
        QUICK_IDLE_ENFORCE,
        {"policy.idle_gpu": {"act_after": "24s"}, "policy.rightsize": {"mode": rightsize_mode}},
        {
            "notify": {
                "enabled": True,
                "smtp_host": "127.0.0.1",
                "smtp_port": smtp_port,
                "domain": "example.org",
                "sender": "slurmgpu@example.org",
            }
        },
    )


def actions(t: Telemetry, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(t.run("actions", "--json", "--job", str(job_id)))
    return list(reversed(rows))


def kinds(t: Telemetry, job_id: int, policy: str = "idle_gpu") -> list[tuple[str, str]]:
    """One policy's decisions for a job, oldest first (jobs of earlier tests in the same
    lab cluster are history too, so rightsizing may have its say about these jobs)."""
    return [(a["kind"], a["outcome"]) for a in actions(t, job_id) if a["policy"] == policy]


def test_idle_job_is_warned_then_requeued_and_a_busy_again_job_is_spared(
    slurm_cluster: LabCluster, tmp_path: Path, smtp: tuple[int, Inbox]
) -> None:
    port, inbox = smtp
    with running_stack(slurm_cluster, tmp_path, policy_config(port, "advise")) as t:
        idle = t.submit(
            "--requeue",
            "--gres=gpu:1",
            "-w",
            "gpu1",
            "--wrap",
            t.fakeload("--util", "0", "--mem", "1GiB", "--duration", "300s"),
        )
        later_busy = t.submit(
            "--requeue",
            "--gres=gpu:1",
            "-w",
            "gpu2",
            "--wrap",
            t.fakeload("--util", "0", "--mem", "1GiB", "--duration", "6s")
            + " ; "
            + t.fakeload("--util", "80", "--mem", "1GiB", "--duration", "120s"),
        )
        wait_for(
            "the idle job to be requeued",
            lambda: ("requeue", "done") in kinds(t, idle),
            timeout_s=120,
        )
        history = kinds(t, idle)
        assert history[0] == ("warn", "notified")
        assert history.index(("warn", "notified")) < history.index(("requeue", "done"))
        requeue = next(
            a for a in actions(t, idle) if a["kind"] == "requeue" and a["policy"] == "idle_gpu"
        )
        assert requeue["mode"] == "enforce"
        assert requeue["numbers"]["idle_minutes"] >= 0.1
        wait_for(
            "the requeue to show in Slurm",
            lambda: any(j.job_id == idle and j.restart_count >= 1 for j in CliSlurmClient().jobs()),
        )
        # The other job was warned while idle, then got busy: it must never be requeued.
        wait_for(
            "the busy-again job's warning", lambda: ("warn", "notified") in kinds(t, later_busy)
        )
        warned_at = next(
            a["at"]
            for a in actions(t, later_busy)
            if a["kind"] == "warn" and a["policy"] == "idle_gpu"
        )
        # It was idle ~6 s (longer on a loaded machine: the second fakeload's start-up),
        # warned at 4 s; act_after is 24 s, so 30 s after the warning it would have been
        # requeued had the policy not seen it busy again.
        wait_for(
            "30 s of daemon cycles after that warning",
            lambda: _seconds_since(warned_at) >= 30.0,
            timeout_s=60,
        )
        assert all(k != "requeue" for k, _ in kinds(t, later_busy))
        assert all(j.restart_count == 0 for j in CliSlurmClient().jobs() if j.job_id == later_busy)
        mails = [text for rcpt, text in inbox.messages if rcpt == ["root@example.org"]]
        assert any(f"{idle}" in text.split("\n\n", 1)[0] for text in mails), "warning mail"


def _seconds_since(iso: str) -> float:
    return (datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds()


def _limit_and_memory(job_id: int) -> tuple[int | None, int | None]:
    for job in CliSlurmClient().jobs():
        if job.job_id == job_id:
            limit = None if job.time_limit is None else int(job.time_limit.total_seconds() // 60)
            return limit, job.memory_mib
    raise AssertionError(f"job {job_id} is not in squeue")


def test_pending_job_is_rightsized_in_enforce_mode_and_left_alone_in_advise_mode(
    slurm_cluster: LabCluster, tmp_path: Path, smtp: tuple[int, Inbox]
) -> None:
    port, _ = smtp
    with running_stack(slurm_cluster, tmp_path, policy_config(port, "advise")) as t:
        history = [
            t.submit("-J", "rs-sim", "-t", "10:00:00", "--mem=2000", "--wrap", "sleep 4")
            for _ in range(3)
        ]

        def finished_with_summaries() -> bool:
            jobs = {j["job_id"]: j for j in json.loads(t.run("jobs", "--json"))}
            return all(jobs.get(h, {}).get("state") == "COMPLETED" for h in history) and all(
                t.usage().summary(h) is not None for h in history
            )

        wait_for("three finished runs with summaries", finished_with_summaries, timeout_s=120)
        pending = t.submit(
            "--hold",
            "--comment",
            "sgpu:rightsize",
            "-J",
            "rs-sim",
            "-t",
            "10:00:00",
            "--mem=2000",
            "--wrap",
            "sleep 1",
        )

        def advised() -> dict[str, Any] | None:
            # The action is stored "pending" first and settles once its email went out.
            return next(
                (
                    a
                    for a in actions(t, pending)
                    if a["policy"] == "rightsize" and a["outcome"] != "pending"
                ),
                None,
            )

        advice = wait_for("rightsize advice for the pending job", advised, timeout_s=60)
        assert advice["mode"] == "advise"
        assert advice["outcome"] == "notified"
        assert "TimeLimit" in advice["fields"]
        assert _limit_and_memory(pending) == (600, 2000), "advise mode must not change the job"

        t.stop_daemon()
        (tmp_path / "config.toml").write_text(
            (tmp_path / "config.toml").read_text().replace('mode = "advise"', 'mode = "enforce"')
        )
        t.start_daemon()

        def enforced() -> dict[str, Any] | None:
            return next(
                (
                    a
                    for a in actions(t, pending)
                    if a["policy"] == "rightsize" and a["outcome"] == "done"
                ),
                None,
            )

        done = wait_for("the rightsize update in enforce mode", enforced, timeout_s=60)
        limit, memory = _limit_and_memory(pending)
        assert limit is not None and limit < 600
        proposed = parse_time_limit(done["fields"]["TimeLimit"])
        assert proposed is not None
        assert limit == int(proposed.total_seconds() // 60)
        if "MinMemoryNode" in done["fields"]:
            assert memory is not None and memory < 2000
        subprocess.run(["scancel", str(pending)], check=False, timeout=30)
