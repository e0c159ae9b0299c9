"""Malleable jobs end to end through the real ``sgpu daemon`` and the real malleable policy.

Daemon (``[policy.malleable]`` in enforce mode, other policies observing), four node
agents with the simulated probe, and the example training
(examples/elastic_train.py, ``sgpu submit --malleable 2:4``, declaring 80 % on its fake
GPUs) on the lab cluster filled by three 4-GPU jobs. A rigid 2-GPU job arrives and
cannot start: the daemon shrinks the training 4 -> 2, the rigid job starts on the GPUs
given back, and once it ends the daemon grows the training back to 4. Its step counter
and loss carry on across both resizes with no step lost or repeated.

A malleable job that arrives when only 2 GPUs are free is started at 2 (its pending
request lowered) instead of waiting, and grown to 4 once GPUs free up.

The daemon SIGKILLed right after each Slurm call of a resize (checkpoint signal, requeue
held, update, release; tests/slurm/resize_fault_daemon.py) and restarted each time: the
resize killed after its signal is aborted (the job checkpointed, waited, and trains on
in place), the next one is carried through three more kills; the job ends up running at
its new size, never left held, requeued once.

The policy's cost and pacing are set in seconds (production defaults are minutes):
``min_interval``, and the reconfiguration cost assumed before one is measured.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.cycle.resize import HELD_REASONS
from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import Job, JobState
from tests.configs import config_toml, observing
from tests.polling import wait_for
from tests.slurm.elastic_training import (
    assert_continuous,
    fill_cluster,
    sbatch,
    starts,
    steps,
    trainer,
)
from tests.slurm.harness import SLURM, Telemetry, listed_job, running_job, running_stack
from tests.slurm.train_log import read_jsonl

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "fills the 4-node lab's 16 GPUs for the resize (16 nodes: 15 fillers, not 3)"

CONFIG = config_toml(
    observing("rightsize", "idle_gpu", "colocate"),
    {
        "policy.malleable": {
            "mode": "enforce",
            "min_interval": "5s",
            "checkpoint_time": "2s",
            "requeue_delay": "2s",
            "startup_time": "2s",
        }
    },
)


def malleable_actions(t: Telemetry, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        t.run("actions", "--json", "--job", str(job_id), "--policy", "malleable")
    )
    return list(reversed(rows))  # oldest first


@pytest.mark.slow
def test_the_daemon_shrinks_a_malleable_job_for_a_rigid_job_and_grows_it_back(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    log = tmp_path / "elastic.jsonl"
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        elastic = trainer(t, log)
        wait_for("the malleable job at 4 GPUs", lambda: running_job(elastic, 4))
        wait_for("10 steps", lambda: len(steps(log)) >= 10)
        fill_cluster(t)
        submitted = time.monotonic()
        rigid = sbatch(t, "--gres=gpu:2", "-t", "1", "-J", "rigid", "--wrap", "sleep 15")

        wait_for("the rigid job running", lambda: running_job(rigid), timeout_s=90)
        rigid_started = time.monotonic() - submitted
        wait_for("the malleable job at 2 GPUs", lambda: running_job(elastic, 2), timeout_s=30)
        shrink = malleable_actions(t, elastic)
        assert [(a["numbers"]["direction"], a["outcome"]) for a in shrink] == [("shrink", "done")]
        assert shrink[0]["numbers"]["for_job"] == rigid
        assert shrink[0]["fields"] == {"from_gpus": "4", "to_gpus": "2"}

        wait_for(
            "the rigid job done",
            lambda: (j := listed_job(rigid)) and j.state.is_terminal,
            timeout_s=60,
        )
        ended = time.monotonic()
        grown = wait_for("the malleable job at 4 GPUs again", lambda: running_job(elastic, 4))
        grow_s = time.monotonic() - ended
        assert grown.restart_count == 2
        wait_for(
            "steps after the expansion",
            lambda: (
                len(starts(log)) == 3 and steps(log) and steps(log)[-1] > starts(log)[-1][2] + 3
            ),
        )
        assert [(g, r) for g, r, _ in starts(log)] == [(4, 0), (2, 1), (4, 2)]
        assert_continuous(log)
        moves = [(a["numbers"]["direction"], a["outcome"]) for a in malleable_actions(t, elastic)]
        assert moves == [("shrink", "done"), ("expand", "done")]
        print(
            f"\nmalleable e2e: rigid job submit -> running {rigid_started:.1f} s; "
            f"rigid job ended -> malleable job at 4 GPUs {grow_s:.1f} s",
            file=sys.stderr,
        )


def kill_daemon_after(t: Telemetry, call: str) -> str:
    """Run the daemon until it SIGKILLs itself after the resize's ``call``; the marker."""
    return t.run_daemon_until_killed("resize_fault_daemon", call, 90)


def held(j: Job | None) -> bool:
    return j is not None and j.state is JobState.PENDING and j.reason in HELD_REASONS


@pytest.mark.slow
def test_the_daemon_killed_after_each_slurm_call_of_a_resize_never_holds_or_resizes_twice(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    log = tmp_path / "elastic.jsonl"
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        elastic = trainer(t, log)
        wait_for("the malleable job at 4 GPUs", lambda: running_job(elastic, 4))
        wait_for("10 steps", lambda: len(steps(log)) >= 10)
        fill_cluster(t)
        t.stop_daemon()  # from here on, daemons that die mid-resize
        # Long enough that no expansion back starts before the checks.
        rigid = sbatch(t, "--gres=gpu:2", "-t", "2", "-J", "rigid", "--wrap", "sleep 90")
        calls = ("signal", "requeue", "update", "release")
        kills = [kill_daemon_after(t, call).split() for call in calls]
        assert kills == [[c, str(elastic)] for c in calls]
        t.start_daemon()

        wait_for("the rigid job running", lambda: running_job(rigid), timeout_s=60)
        final = wait_for(
            "the malleable job at 2 GPUs", lambda: running_job(elastic, 2), timeout_s=60
        )
        assert final.restart_count == 1  # requeued once: never resized twice
        wait_for(
            "steps at 2 GPUs",
            lambda: len(starts(log)) == 2 and steps(log)[-1] > starts(log)[-1][2] + 5,
        )
        assert not held(listed_job(elastic))
        assert [(g, r) for g, r, _ in starts(log)] == [(4, 0), (2, 1)]
        assert_continuous(log)
        # The run signalled by the daemon that died trained on in place after its wait.
        assert [r["event"] for r in read_jsonl(log) if r.get("event") == "resumed_in_place"]

        def closed() -> list[dict[str, Any]] | None:
            rows: list[dict[str, Any]] = json.loads(
                t.run("resizes", "--json", "--job", str(elastic))
            )
            return rows if rows and rows[0]["state"] != "released" else None

        # RELEASED -> RUNNING is the daemon's next cycle after it sees the job at its new
        # size, not the moment the job runs: wait for it (a loaded machine once lagged).
        resizes = wait_for("the resize closed", closed, timeout_s=60)
        assert [(r["state"], r["from_gpus"], r["to_gpus"]) for r in resizes] == [
            ("running", 4, 2),
            ("aborted", 4, 2),
        ]
        assert resizes[1]["error"] == "the daemon stopped before the checkpoint request"
        shrinks = malleable_actions(t, elastic)
        assert [(a["numbers"]["direction"], a["outcome"]) for a in shrinks] == [
            ("shrink", "failed"),  # interrupted: settled on restart, not confirmed
            ("shrink", "done"),
        ]
        assert "interrupted" in shrinks[0]["error"]
        text = (t.tmp / "daemon.log").read_text()
        assert text.count("resumes at") >= 3, "each restarted daemon carried the resize on"


@pytest.mark.slow
def test_a_waiting_malleable_job_starts_at_the_gpus_free_and_grows_later(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    log = tmp_path / "elastic.jsonl"
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        full = [sbatch(t, "--gres=gpu:4", "--wrap", "sleep 600") for _ in range(3)]
        half = sbatch(t, "--gres=gpu:2", "--wrap", "sleep 600")
        wait_for("3 full nodes and a half one", lambda: all(running_job(j) for j in [*full, half]))
        elastic = trainer(t, log, "-t", "3")

        started = wait_for("the malleable job running at 2 GPUs", lambda: running_job(elastic, 2))
        assert started.restart_count == 0  # started smaller, not resized
        (update,) = [a for a in malleable_actions(t, elastic) if a["kind"] == "update"]
        assert update["outcome"] == "done" and update["numbers"]["direction"] == "start_smaller"
        assert update["fields"]["TresPerNode"] == "gres:gpu:2"  # Slurm 22.05's spelling
        # Fewer GPUs run slower: the limit (-t 3) is raised in the same update.
        assert set(update["fields"]) == {"TresPerNode", "TimeLimit"}
        h, m, sec = (int(x) for x in update["fields"]["TimeLimit"].split(":"))
        assert h * 3600 + m * 60 + sec > 3 * 60
        # Enough steps that the loss has clearly fallen before the resize (after 10 it was
        # once still above 0.8 x the first step's, and "trained on" could not be told).
        wait_for("steps at 2 GPUs", lambda: len(steps(log)) >= 40)

        SLURM.cancel(half)
        grown = wait_for("the malleable job grown to 4 GPUs", lambda: running_job(elastic, 4))
        assert grown.restart_count == 1
        wait_for(
            "steps at 4 GPUs",
            lambda: len(starts(log)) == 2 and steps(log)[-1] > starts(log)[-1][2] + 3,
        )
        assert [(g, r) for g, r, _ in starts(log)] == [(2, 0), (4, 1)]
        assert_continuous(log)
        moves = [(a["kind"], a["numbers"]["direction"]) for a in malleable_actions(t, elastic)]
        assert moves == [("update", "start_smaller"), ("resize", "expand")]
