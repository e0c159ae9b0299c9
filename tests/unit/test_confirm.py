"""actuate/confirm.py: an interrupted update is judged by comparing its intents with the job
record Slurm lists, whichever release spelt the fields the audit kept."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurmgpu.actuate.confirm import Verdict, check, judge
from slurmgpu.intent import (
    Intent,
    NarrowToShards,
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetNice,
    SetNodes,
    SetTimeLimit,
    StartSoon,
)
from slurmgpu.model import GpuRequest, Job
from slurmgpu.slurm.update import audit_fields
from tests.unit.policy_builders import T0, pending_job

RELEASES = ("22.05.8", "24.11.5", "26.05.5")
JOB = pending_job(
    7,
    time_limit=timedelta(hours=2),
    cpus=24,
    memory_mib=32_768,
    gpus_per_node=2,
    comment="x sgpu:separated",
)
PER_JOB = pending_job(8, gpus_per_node=None, gpus_per_job=4)
SHARDS = replace(JOB, gpus=GpuRequest(gpus=0, shards=2, shards_per_node=2))

# (intent, the job that shows it in place, the same intent not applied there, verdict text)
SHOWN: list[tuple[Intent, Job, Intent, str]] = [
    (SetTimeLimit(7200), JOB, SetTimeLimit(5400), "TimeLimit 02:00:00"),
    (SetTimeLimit(7230), JOB, SetTimeLimit(None), "TimeLimit 02:00:00"),  # within a minute
    (SetCpus(24), JOB, SetCpus(12), "NumCPUs 24"),
    (SetMemoryPerNode(32_768), JOB, SetMemoryPerNode(9728), "memory 32768 MiB"),
    (SetGpus(2), JOB, SetGpus(1), "TresPerNode gpu 2"),
    (SetGpus(4, per_node=False), PER_JOB, SetGpus(2, per_node=False), "TresPerJob gpu 4"),
    (NarrowToShards(2), SHARDS, NarrowToShards(4), "TresPerNode shard 2"),
    (SetComment("x sgpu:separated"), JOB, SetComment("x"), "Comment 'x sgpu:separated'"),
]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("done", "job", "not_done", "shows"), SHOWN)
def test_an_update_is_taken_when_the_listing_shows_its_intent(
    release: str, done: Intent, job: Job, not_done: Intent, shows: str
) -> None:
    got = check(done, job)
    assert got is not None and got[1] is True and got[2] == shows
    key = got[0]
    assert judge("update", audit_fields((done,), release), T0, job) == (
        Verdict.TAKEN,
        f"{key} in place",
    )
    assert judge("update", audit_fields((not_done,), release), T0, job) == (
        Verdict.NOT_APPLIED,
        shows,
    )


def test_one_intent_not_in_place_means_the_one_update_did_not_happen() -> None:
    both = (SetTimeLimit(7200), SetCpus(24), SetGpus(2))
    assert judge("update", audit_fields(both, "24.11.5"), T0, JOB) == (
        Verdict.TAKEN,
        "NumCPUs, TimeLimit, TresPerNode in place",
    )
    half = (SetTimeLimit(7200), SetCpus(8))
    assert judge("update", audit_fields(half, "22.05.8"), T0, JOB) == (
        Verdict.NOT_APPLIED,
        "NumCPUs 24",
    )


@pytest.mark.parametrize(
    "intent", [SetCpusPerNode(4), SetNice(100), SetNodes(1), StartSoon(1)], ids=repr
)
def test_intents_the_listing_does_not_show_confirm_nothing(intent: Intent) -> None:
    assert check(intent, JOB) is None
    assert judge("update", audit_fields((intent,), "24.11.5"), T0, JOB) == (
        Verdict.NOT_CONFIRMED,
        "Slurm's listing does not show the changed fields",
    )


def test_what_a_job_record_lacks_is_not_judged() -> None:
    two_nodes = replace(JOB, node_count=2)
    assert check(SetMemoryPerNode(16_384), two_nodes) is None  # the listing has the total
    assert check(SetGpus(2, per_node=False), JOB) is None  # a per-node request
    assert check(NarrowToShards(2), PER_JOB) is None


def test_rows_written_before_intents_are_judged_the_same_way() -> None:
    # The audit's format did not change: 22.05 rows spell gres:, later ones gres/.
    old = {"TresPerNode": "gres:gpu:2", "TimeLimit": "2:00:00", "MinCPUsNode": "12"}
    assert judge("update", old, T0, JOB) == (Verdict.TAKEN, "TimeLimit, TresPerNode in place")
    assert judge("update", {"TresPerNode": "gres/shard:4"}, T0, SHARDS) == (
        Verdict.NOT_APPLIED,
        "TresPerNode shard 2",
    )
