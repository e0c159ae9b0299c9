"""Least attained service end to end: the real ``sgpu daemon`` preempts through Slurm.

Daemon with ``[policy.las]`` enabled in enforce mode (one queue limit of a few GPU-seconds
and second-scale guardrails, so the test runs in a minute; production defaults are
16 GPU-h and minutes), the other policies observing, four node agents on the simulated
probe, the lab cluster filled by three rigid 4-GPU jobs (not opted in: never touched).
A checkpointable training (examples/elastic_train.py, ``sgpu submit --malleable 2:4``) has
run past the limit when a second one arrives: the daemon preempts the first by the
resize transaction at its own size (checkpoint signal, requeue held, update with
``Nice``, release), the newcomer starts on its GPUs, and the first waits with its queue's
nice. Once the newcomer is gone the first resumes where it checkpointed, no step lost or
repeated.

When the newcomer needs no more than the first can give above its minimum, the first is
*shrunk* instead (the same transaction, to the smaller size, no ``Nice``) and keeps
training beside it; once the newcomer is gone LAS gives it its GPUs back (the malleable
policy only observes here, so LAS grows the jobs it shrank itself).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import Job, JobState
from tests.configs import config_toml, observing
from tests.polling import wait_for
from tests.slurm.elastic_training import assert_continuous, fill_cluster, starts, steps, trainer
from tests.slurm.harness import (
    SLURM,
    Telemetry,
    lab_dir,
    listed_job,
    running_job,
    running_stack,
)

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "fills the 4-node lab's 16 GPUs for the resize (16 nodes: 15 fillers, not 3)"

CONFIG = config_toml(
    observing("rightsize", "idle_gpu", "colocate", "malleable"),
    {
        "policy.las": {
            "enabled": True,
            "mode": "enforce",
            "queue_limits": [0.002],
            "min_runtime": "5s",
            "min_wait": "1s",
        }
    },
)


def las_actions(t: Telemetry, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        t.run("actions", "--json", "--job", str(job_id), "--policy", "las")
    )
    return list(reversed(rows))  # oldest first


@pytest.mark.slow
def test_the_daemon_preempts_a_long_running_job_for_a_new_one_and_it_resumes(
    slurm_cluster: LabCluster,
) -> None:
    tmp_path = lab_dir(slurm_cluster, "sgpu-las-")  # a chroot's jobs see it too
    first_log = tmp_path / "first.jsonl"
    second_log = tmp_path / "second.jsonl"
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        first = trainer(t, first_log)
        wait_for("the first training at 4 GPUs", lambda: running_job(first, 4))
        # 0.002 GPU-h = 7.2 GPU-s: 4 GPUs for 2 s; enough steps for a clear loss drop
        wait_for("40 steps", lambda: len(steps(first_log)) >= 40)
        fill_cluster(t)
        second = trainer(t, second_log)

        wait_for("the second training running", lambda: running_job(second, 4), timeout_s=90)

        def pending_with_nice() -> Job | None:
            j = listed_job(first)
            return j if j is not None and j.state is JobState.PENDING and j.nice > 0 else None

        waiting = wait_for("the first one pending with its queue's nice", pending_with_nice)
        assert waiting.nice == 100_000 and waiting.restart_count == 1
        (preempt,) = [a for a in las_actions(t, first) if a["kind"] == "resize"]
        assert preempt["outcome"] == "done"
        assert preempt["fields"]["preempt"] == "1" and preempt["fields"]["Nice"] == "100000"
        assert preempt["numbers"]["for_job"] == second
        # the newcomer was never touched
        assert [a for a in las_actions(t, second) if a["kind"] == "resize"] == []

        SLURM.cancel(second)
        wait_for("the first training back at 4 GPUs", lambda: running_job(first, 4), timeout_s=90)
        wait_for(
            "steps after it resumed",
            lambda: (
                len(starts(first_log)) == 2 and steps(first_log)[-1] > starts(first_log)[-1][2] + 3
            ),
        )
        assert [(g, r) for g, r, _ in starts(first_log)] == [(4, 0), (4, 1)]
        assert_continuous(first_log)


@pytest.mark.slow
def test_the_daemon_shrinks_a_malleable_long_job_for_a_new_one_and_grows_it_back(
    slurm_cluster: LabCluster,
) -> None:
    tmp_path = lab_dir(slurm_cluster, "sgpu-las-")  # a chroot's jobs see it too
    first_log = tmp_path / "first.jsonl"
    second_log = tmp_path / "second.jsonl"
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        first = trainer(t, first_log)  # --malleable 2:4 on 4 GPUs: it can give 2
        wait_for("the first training at 4 GPUs", lambda: running_job(first, 4))
        wait_for("40 steps", lambda: len(steps(first_log)) >= 40)
        fill_cluster(t)
        second = trainer(t, second_log, gpus=2, malleable="1:2", name="newcomer")

        wait_for("the second training running", lambda: running_job(second, 2), timeout_s=90)
        wait_for("the first training on 2 GPUs beside it", lambda: running_job(first, 2))
        (shrink,) = [a for a in las_actions(t, first) if a["kind"] == "resize"]
        assert shrink["outcome"] == "done"
        assert shrink["numbers"]["shrink"] == 1 and shrink["numbers"]["for_job"] == second
        assert (shrink["numbers"]["from_gpus"], shrink["numbers"]["to_gpus"]) == (4, 2)
        assert "Nice" not in shrink["fields"] and "preempt" not in shrink["fields"]
        assert [a for a in las_actions(t, second) if a["kind"] == "resize"] == []

        SLURM.cancel(second)
        wait_for("the first training back at 4 GPUs", lambda: running_job(first, 4), timeout_s=90)
        wait_for(
            "steps after it grew back",
            lambda: (
                len(starts(first_log)) == 3 and steps(first_log)[-1] > starts(first_log)[-1][2] + 3
            ),
        )
        grow = [a for a in las_actions(t, first) if a["kind"] == "resize"][-1]
        assert grow["numbers"]["grow_back"] == 1 and grow["outcome"] == "done"
        assert [(g, r) for g, r, _ in starts(first_log)] == [(4, 0), (2, 1), (4, 2)]
        assert_continuous(first_log)
