"""A rightsized job that a site limit stops for ever gets its request back
(slurmgpu/policy/rightsize_undo.py, slurmgpu/daemon/rightsize_undo.py); the real-cluster
side is tests/slurm/test_rightsize_limits_real.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.config import Settings
from slurmgpu.daemon.app import Daemon
from slurmgpu.daemon.lease import DaemonLease
from slurmgpu.daemon.rightsize_undo import RightsizeUndo
from slurmgpu.intent import (
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetTimeLimit,
)
from slurmgpu.model import Job, JobState, Node
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.policy.recommend import recommendations
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.rightsize_undo import (
    FIELDS,
    MAX_UNDO_TRIES,
    RightsizeChanges,
    blamed_fields,
    stuck_by_limit,
    undo_action,
)
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.slurm.client import SlurmCommandError
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.tokens import rightsize_opted_out
from tests.fakes import FakeSlurm
from tests.unit.policy_builders import HOUR, MIN, pending_job, record, snapshot

NODES = [Node("gpu1", "idle", gpus=4, partitions=("gpu",), address="127.0.0.1")]
# rightsized from 64 GiB, 48 CPUs, 4 GPUs a node, 8 h
BEFORE = RightsizeChanges(
    time_limit_s=8 * 3600.0, memory_per_node_mib=65536, cpus=48, gpus=4, gpus_per_node=True
)


def lowered(job_id: int = 100, reason: str = "QOSMinCpuNotSatisfied", **extra: object) -> Job:
    """A pending job as rightsizing left it: 2 h, 8 GiB, 4 CPUs, 1 GPU a node."""
    fields: dict[str, object] = {
        "time_limit": timedelta(hours=2),
        "memory_mib": 8192,
        "cpus": 4,
        "gpus_per_node": 1,
        "reason": reason,
        "comment": "run 3 sgpu:rightsize",
    }
    return pending_job(job_id, **{**fields, **extra})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reason", "stuck"),
    [
        ("QOSMinCpuNotSatisfied", True),
        ("QOSMinMemory", True),
        ("QOSMinGRES", True),
        ("AssocMinCpus", True),
        ("BadConstraints", True),
        ("PartitionConfig", True),
        ("PartitionNodeLimit", True),
        ("PartitionTimeLimit", True),
        ("Resources", False),
        ("Priority", False),
        ("QOSMaxJobsPerUserLimit", False),  # left when the user's other jobs end
        ("JobHeldUser", False),
        ("", False),
    ],
)
def test_which_reasons_a_job_never_leaves(reason: str, stuck: bool) -> None:
    assert stuck_by_limit(reason) is stuck


def test_a_stuck_rightsized_job_gets_every_lowered_field_back_and_is_left_alone() -> None:
    a = undo_action(lowered(), BEFORE)
    assert a is not None
    assert (a.policy, a.kind, a.alert, a.protective) == (
        "rightsize",
        "update",
        "rightsize_undo",
        True,
    )
    assert a.intents == (
        SetTimeLimit(8 * 3600),
        SetMemoryPerNode(65536),
        SetGpus(4, None, per_node=True),
        SetCpus(48),
        SetCpusPerNode(48),
        SetComment("run 3 sgpu:rightsize sgpu:norightsize"),
    )
    assert a.numbers["reason"] == "QOSMinCpuNotSatisfied"
    assert "QOSMinCpuNotSatisfied" in a.reason and "48 CPUs" in a.reason


def test_only_the_fields_rightsizing_lowered_go_back() -> None:
    job = lowered(node_count=2, gpus_per_job=2, gpus_per_node=None)
    a = undo_action(job, RightsizeChanges(cpus=24, gpus=4, gpus_per_node=False))
    assert a is not None
    assert a.intents[:3] == (SetGpus(4, None, per_node=False), SetCpus(24), SetCpusPerNode(12))
    assert len(a.intents) == 4  # and the comment


def test_only_stuck_pending_jobs_rightsizing_lowered_are_undone() -> None:
    job = lowered()
    assert undo_action(job, None) is None  # never rightsized
    assert undo_action(job, RightsizeChanges()) is None  # nothing lowered
    assert undo_action(job, replace(BEFORE, undone=True)) is None  # once
    assert undo_action(job, replace(BEFORE, undo_failures=MAX_UNDO_TRIES)) is None
    assert undo_action(job, replace(BEFORE, undo_failures=MAX_UNDO_TRIES - 1)) is not None
    assert undo_action(replace(job, reason="Resources"), BEFORE) is None
    assert undo_action(replace(job, reason="JobHeldUser"), BEFORE) is None
    assert undo_action(replace(job, state=JobState.RUNNING), BEFORE) is None


def _rightsized(store: JobStore, job: Job, outcome: str = "done") -> None:
    """Audit a rightsize update of ``job`` as the policy and the actuator write it."""
    audit = AuditStore(store.engine, store.cluster)
    action = Action(
        "rightsize",
        "update",
        job.job_id,
        job.user,
        "3 past runs (user+name+partition) suggest ...",
        {
            "time_limit_current_s": 8 * 3600,
            "time_limit_proposed_s": 2 * 3600,
            "memory_per_node_current_mib": 65536,
            "memory_per_node_proposed_mib": 8192,
            "gpus_current": 4,
            "gpus_proposed": 1,
            "gpus_per_node_current": 4,
            "gpus_per_node_proposed": 1,
            "cpus_current": 48,
            "cpus_proposed": 4,
        },
        (SetTimeLimit(2 * 3600), SetMemoryPerNode(8192), SetGpus(1), SetCpus(4)),
        "rightsize",
    )
    (row,) = audit.record(
        [Decision(action, Mode.ENFORCE, execute=True, notify=False)],
        datetime.now(UTC) - timedelta(hours=1),
        slurm_version="22.05.8",
    )
    audit.set_outcome(row, outcome)


def test_the_audit_says_what_the_first_rightsize_lowered(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        job = lowered()
        _rightsized(store, job)
        _rightsized(store, replace(job, job_id=101), outcome="failed")  # not lowered
        audit = AuditStore(store.engine, store.cluster)
        assert audit.rightsize_changes([100, 101, 102]) == {100: BEFORE}
    finally:
        store.engine.dispose()


def _daemon(tmp_path: Path, slurm: FakeSlurm) -> tuple[Daemon, JobStore, DaemonLease]:
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=60))
    lease.acquire()
    daemon = Daemon(Settings().with_database(url), store, slurm, lease, poll=timedelta(seconds=30))
    return daemon, store, lease


def test_the_daemon_undoes_it_once_and_leaves_other_stuck_jobs_alone(tmp_path: Path) -> None:
    job = lowered()
    # stuck too, but never rightsized: not the daemon's doing
    other = lowered(101, reason="QOSMinMemory")
    slurm = FakeSlurm([replace(job, reason="Priority"), other], NODES)
    daemon, store, lease = _daemon(tmp_path, slurm)
    try:
        _rightsized(store, job)
        daemon.run_once()  # waits for its turn: nothing to undo
        assert slurm.updates == []
        slurm.set_jobs([job, other])
        daemon.run_once()
        ((job_id, intents),) = slurm.updates
        assert job_id == 100 and SetMemoryPerNode(65536) in intents
        back = {j.job_id: j for j in slurm.jobs()}[100]
        assert (back.memory_mib, back.cpus, back.time_limit) == (65536, 48, timedelta(hours=8))
        assert rightsize_opted_out(back.comment)
        rows = AuditStore(store.engine, store.cluster).list(job_id=100, policy="rightsize")
        assert rows[0].outcome == "done" and "restored_cpus" in rows[0].numbers  # the undo
        assert rows[0].fields["MinMemoryNode"] == "65536"
        assert "sgpu_rightsize_undos_total 1.0" in daemon.metrics.exposition().decode()
        # Slurm keeps the stale reason a while: not undone twice
        slurm.set_jobs([replace(back, reason="QOSMinCpuNotSatisfied"), other])
        daemon.run_once()
        assert len(slurm.updates) == 1
    finally:
        lease.release()
        store.engine.dispose()


def test_an_undo_slurm_refuses_is_audited_failed_and_tried_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    job = lowered()
    slurm = FakeSlurm([job], NODES)
    slurm.update_fails_with = SlurmCommandError(
        f"scontrol update jobid={job.job_id}: Access/permission denied"
    )
    daemon, store, lease = _daemon(tmp_path, slurm)
    try:
        _rightsized(store, job)
        for _ in range(MAX_UNDO_TRIES + 2):
            daemon.run_once()
        rows = AuditStore(store.engine, store.cluster).list(job_id=100, policy="rightsize")
        undos = [r for r in rows if "restored_cpus" in r.numbers]
        assert len(undos) == MAX_UNDO_TRIES
        assert all(r.outcome == "failed" for r in undos)
        assert "Access/permission denied" in (undos[0].error or "")
        # the job is as Slurm has it: untouched
        assert {j.job_id: j for j in slurm.jobs()}[100] == job
    finally:
        lease.release()
        store.engine.dispose()


def test_a_key_undone_is_not_lowered_that_way_again() -> None:
    history = [record(run_time=MIN * 50, gpus_used=1, mean_cpu_pct=100.0) for _ in range(3)]
    job = pending_job(time_limit=8 * HOUR, cpus=96, gpus_per_node=4)
    snap = snapshot([job], history=history)
    policy = RightsizePolicy()

    def fields() -> set[type]:
        return {type(i) for a in policy.propose(snap) for i in a.intents}

    every = {SetTimeLimit, SetMemoryPerNode, SetGpus, SetCpus, SetCpusPerNode}
    assert fields() == every
    policy.hold_back("alice", "train", "gpu", blamed_fields("QOSMinMemory"))
    assert fields() == every - {SetMemoryPerNode}  # judged again, not from the memo
    policy.hold_back("alice", "train", "gpu", blamed_fields("QOSMinCpuNotSatisfied"))
    assert fields() == {SetTimeLimit, SetGpus}
    policy.hold_back("bob", "train", "gpu", FIELDS)  # another key: no change here
    assert fields() == {SetTimeLimit, SetGpus}
    policy.hold_back("alice", "train", "gpu", blamed_fields("BadConstraints"))
    assert policy.propose(snap) == []


def test_a_restarted_daemon_holds_back_what_earlier_undos_blamed(tmp_path: Path) -> None:
    job = lowered(reason="QOSMinMemory")
    slurm = FakeSlurm([job], NODES)
    daemon, store, lease = _daemon(tmp_path, slurm)
    try:
        _rightsized(store, job)
        daemon.run_once()
        assert len(slurm.updates) == 1  # the undo
    finally:
        lease.release()
    # the next daemon's policy: told at its first cycle, before it proposes anything
    history = [record(run_time=MIN * 50, gpus_used=1, mean_cpu_pct=100.0) for _ in range(3)]
    fresh = pending_job(200, time_limit=8 * HOUR, cpus=96, gpus_per_node=4)
    policy = RightsizePolicy()
    audit = AuditStore(store.engine, store.cluster)
    undo = RightsizeUndo(Actuator(slurm, audit), audit, policy)
    try:
        assert undo.after_cycle([fresh], datetime.now(UTC)) == []
        (action,) = policy.propose(snapshot([fresh], history=history))
        assert not any(isinstance(i, SetMemoryPerNode) for i in action.intents)
        assert any(isinstance(i, SetCpus) for i in action.intents)
    finally:
        store.engine.dispose()


def test_the_submit_time_export_leaves_out_what_an_undo_blamed() -> None:
    """plugins/slurmgpu_submit.lua lowers new jobs from the export: a key held back is not
    lowered there either, nor is the user's fallback (the QOS holds for all their jobs)."""
    s = RightsizeSettings()
    history = [record(run_time=MIN * 50, gpus_used=1, peak_memory_mib=1000.0) for _ in range(3)]
    policy = RightsizePolicy(s)
    priors = policy.priors(tuple(history))
    by_key, fallback = recommendations(priors, s, policy.sizing, policy.held_back)
    key = "alice|train|gpu"
    assert by_key[key]["mem_mib"] is not None and fallback["alice"]["mem_mib"] is not None
    policy.hold_back("alice", "train", "gpu", blamed_fields("QOSMinMemory"))
    held, held_fallback = recommendations(priors, s, policy.sizing, policy.held_back)
    assert held[key] == {**by_key[key], "mem_mib": None}
    assert held_fallback["alice"] == {**fallback["alice"], "mem_mib": None}
