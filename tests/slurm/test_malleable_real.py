"""Malleable jobs on the real lab cluster (slurmctld + 4 slurmd, 4 fake GPUs each).

The example training (examples/elastic_train.py, submitted with ``sgpu submit
--malleable``) shrinks from 4 to 2 GPUs when a rigid 2-GPU job waits on a full cluster
and grows back after it ends, its steps continuing with none lost or repeated; a job
that did not opt in is never signalled; an array pool expands and shrinks requeueing
only the chosen tasks; the resize machinery SIGKILLed after each Slurm call leaves the
job running once resized, never held; a job that ignores the signal is not requeued.

The resizes are driven by ``tests/slurm/resize_driver.py``: the daemon's own
MalleableActuator (recover, start, advance on a fresh squeue listing) in a process the
test can kill.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import Job, JobState
from tests.polling import wait_for
from tests.slurm.harness import EXAMPLE, Lab, driven_lab, lab_dir
from tests.slurm.train_log import last_step_per_run

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "fills the 4-node lab's 16 GPUs for the resize (16 nodes: 15 fillers, not 3)"


@pytest.fixture
def lab(slurm_cluster: LabCluster) -> Iterator[Lab]:
    # under the lab's root, the checkout and this Python shared: runs on a chroot too
    with driven_lab(lab_dir(slurm_cluster, "sgpu-malleable-")) as it:
        yield it


def _consecutive(steps: list[int]) -> bool:
    return bool(steps) and steps == list(range(1, len(steps) + 1))


def test_a_malleable_job_shrinks_for_a_rigid_job_and_grows_back(lab: Lab) -> None:
    job = lab.trainer("elastic", 4, 2, 4, 100000, "-t", "30")
    wait_for("the malleable job at 4 GPUs", lambda: lab.running(job, 4))
    wait_for("10 steps", lambda: len(lab.steps("elastic")) >= 10)
    fillers = [lab.sbatch("--gres=gpu:4", "--wrap", "sleep 600") for _ in range(3)]
    wait_for("the fillers running", lambda: all(lab.running(f) for f in fillers))
    rigid = lab.sbatch("--gres=gpu:2", "-t", "1", "--wrap", "sleep 15")
    wait_for("the rigid job blocked", lambda: (j := lab.job(rigid)) and j.reason == "Resources")

    # Returns once the job runs at its new size; its limit for 2 GPUs goes in the same
    # update of the held job (the policy's rule: policy/resize_limit.py).
    lab.drive("--start", f"{job}:4:2", "--time-limit", "00:55:00")
    started = lab.job(rigid)
    assert started is not None and started.start_time is not None  # it got the GPUs
    shrunk = lab.running(job, 2)
    assert shrunk is not None and shrunk.time_limit == timedelta(minutes=55)
    wait_for(
        "the rigid job done", lambda: (j := lab.job(rigid)) and j.state.is_terminal, timeout_s=90
    )
    lab.drive("--start", f"{job}:2:4")
    resized = wait_for("the malleable job at 4 GPUs again", lambda: lab.running(job, 4))
    assert resized.restart_count == 2
    wait_for(
        "steps after the second resize",
        lambda: (
            [s for s in lab.starts("elastic") if s[1] == 2]
            and lab.steps("elastic")[-1] > lab.starts("elastic")[-1][2] + 3
        ),
    )
    starts = lab.starts("elastic")
    assert [(g, r) for g, r, _ in starts] == [(4, 0), (2, 1), (4, 2)]
    steps = lab.steps("elastic")
    assert _consecutive(steps), "a step was lost or repeated across the resizes"
    # Each run resumed from exactly the step where the previous one checkpointed.
    for (_, _, resumed), prev_last in zip(
        starts[1:], last_step_per_run(lab.log("elastic")), strict=True
    ):
        assert resumed == prev_last
    losses = {int(r["step"]): float(r["loss"]) for r in lab.log("elastic") if "event" not in r}
    first = losses[1]
    for _, _, resumed in starts[1:]:
        assert isinstance(resumed, int)
        assert losses[resumed + 1] < 0.8 * first  # trained on, not from scratch
    rows = lab.sgpu("actions", "--job", str(job))
    assert "test" in rows and "resize" in rows


def test_a_shrunk_job_overtaken_while_requeued_is_an_ordinary_pending_job_again(
    lab: Lab,
) -> None:
    """The requeue frees the job's whole node for a moment and Slurm starts the job
    waiting first, a 4-GPU one: the job, released at 2 GPUs, waits behind it. Its
    transaction closes as overtaken (here after 10 s, 10 min by default) instead of
    holding the job, which stays pending at 2 GPUs, not held, and runs once GPUs free."""
    job = lab.trainer("elastic", 4, 2, 4, 100000, "-t", "30")
    wait_for("the malleable job at 4 GPUs", lambda: lab.running(job, 4))
    wait_for("5 steps", lambda: len(lab.steps("elastic")) >= 5)
    fillers = [lab.sbatch("--gres=gpu:4", "--wrap", "sleep 600") for _ in range(3)]
    wait_for("the fillers running", lambda: all(lab.running(f) for f in fillers))
    first = lab.sbatch("--gres=gpu:4", "-t", "5", "--wrap", "sleep 300")
    wait_for("the 4-GPU job blocked", lambda: (j := lab.job(first)) and j.reason == "Resources")

    out = lab.drive("--start", f"{job}:4:2", "--overtaken-after", "10")
    assert "nothing in flight" in out
    assert lab.running(first, 4) is not None, "the job first in line took the node"
    waiting = lab.job(job)
    assert waiting is not None and waiting.state is JobState.PENDING
    assert waiting.gpus.gpus == 2 and "Held" not in waiting.reason, waiting
    rows = lab.sgpu("resizes", "--job", str(job), "--json")
    assert '"overtaken"' in rows and "overtaken: still pending" in rows, rows
    lab.slurm.cancel(str(first))
    wait_for("the job at 2 GPUs", lambda: lab.running(job, 2), timeout_s=90)


def test_a_job_that_did_not_opt_in_is_never_signalled_held_or_updated(lab: Lab) -> None:
    marker = lab.tmp / "got-signal"
    script = lab.tmp / "rigid.sh"
    script.write_text(
        f"#!/bin/bash\ntrap 'touch {marker}' USR2 TERM\nwhile true; do sleep 0.2; done\n"
    )
    job = lab.sbatch("--gres=gpu:2", "--requeue", str(script))
    wait_for("the rigid job running", lambda: lab.running(job, 2))
    out = lab.drive("--start", f"{job}:2:1", expect=3)
    assert "not malleable" in out
    running = lab.running(job, 2)
    assert (
        running is not None
        and running.restart_count == 0
        and running.reason != "job_requeued_in_held_state"
    )
    assert not marker.exists()


def test_a_job_ignoring_the_checkpoint_signal_is_not_requeued(lab: Lab) -> None:
    script = lab.tmp / "deaf.sh"
    script.write_text("#!/bin/bash\ntrap '' USR2\nwhile true; do sleep 0.2; done\n")
    job = lab.submit("--malleable", "1:2", "--checkpoint-grace", "5s", "--gres=gpu:2", str(script))
    wait_for("the job running", lambda: lab.running(job, 2))
    lab.drive("--start", f"{job}:2:1")  # returns once nothing is in flight
    running = lab.running(job, 2)
    assert running is not None and running.restart_count == 0
    out = lab.sgpu("actions", "--job", str(job), "--json")
    assert "resize" in out


@pytest.mark.parametrize("kill_after", ["signal", "requeue", "update", "release"])
def test_resize_machinery_killed_after_each_slurm_call(lab: Lab, kill_after: str) -> None:
    job = lab.trainer(f"kill-{kill_after}", 4, 2, 4)
    wait_for("the malleable job at 4 GPUs", lambda: lab.running(job, 4))
    wait_for("5 steps", lambda: len(lab.steps(f"kill-{kill_after}")) >= 5)
    out = lab.drive("--start", f"{job}:4:2", "--kill-after", kill_after, expect=-9)
    assert f"SIGKILL after {kill_after}" in out
    lab.drive()  # a new daemon: recover, then carry on
    expected = 4 if kill_after == "signal" else 2
    final = wait_for(
        f"job running at {expected} GPUs", lambda: lab.running(job, expected), timeout_s=60
    )
    assert final.restart_count == (0 if kill_after == "signal" else 1)
    assert final.reason != "job_requeued_in_held_state"
    name = f"kill-{kill_after}"
    wait_for("more steps", lambda: len(lab.steps(name)) >= 12, timeout_s=90)
    assert _consecutive(lab.steps(name))


def test_an_array_pool_expands_and_shrinks_requeueing_only_the_chosen_tasks(lab: Lab) -> None:
    script = lab.tmp / "worker.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} {EXAMPLE} --steps 100000 --step-time 0.2 "
        f"--log {lab.tmp}/task-$SLURM_ARRAY_TASK_ID.jsonl\n"
    )
    array = lab.submit(
        "--pool",
        "--array",
        "0-5%2",
        "--malleable",
        "1:4",
        "--checkpoint-grace",
        "30s",
        "--elastic-dir",
        str(lab.tmp / "state"),
        "--gres=gpu:1",
        str(script),
    )

    def tasks() -> list[Job]:
        return [
            j for j in lab.slurm.jobs() if j.array_job_id == array and j.array_task_id is not None
        ]

    def running() -> list[Job]:
        return [
            t for t in tasks() if t.state is JobState.RUNNING and "COMPLETING" not in t.state_flags
        ]

    wait_for("2 tasks running", lambda: len(running()) == 2)
    lab.drive("--start", f"{array}:2:4")
    wait_for("4 tasks running", lambda: len(running()) == 4, timeout_s=60)
    wait_for(
        "each task training",
        lambda: all((lab.tmp / f"task-{t.array_task_id}.jsonl").exists() for t in running()),
    )
    newest = sorted(running(), key=lambda t: (t.start_time, t.array_task_id), reverse=True)[:2]
    lab.drive("--start", f"{array}:4:2")
    wait_for("2 tasks running", lambda: len(running()) == 2, timeout_s=60)
    restarts = {t.array_task_id: t.restart_count for t in tasks()}
    chosen = {t.array_task_id for t in newest}
    assert {i for i, n in restarts.items() if n > 0} == chosen
    assert {t.array_task_id for t in running()}.isdisjoint(chosen)
