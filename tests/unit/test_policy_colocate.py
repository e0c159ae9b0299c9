"""Co-location: which pending jobs are packed onto shards, and when a pair is separated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path

import pytest

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.cli.submit import take_gpu_mem
from slurmgpu.config import ConfigError, parse_settings
from slurmgpu.intent import NarrowToShards, SetComment
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.policy.base import GpuStat, HistoryRecord, JobUsage, Mode, PolicySnapshot
from slurmgpu.policy.colocate import (
    ALERT_SEPARATE,
    ColocateHints,
    ColocatePolicy,
    hints_from_comment,
)
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.interference import slowdown_with
from slurmgpu.policy.settings import ColocateSettings, PolicyConfigError
from slurmgpu.slurm.client import SlurmCommandError
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from tests.fakes import FakeSlurm
from tests.unit.policy_builders import HOUR, MIN, T0, alert

GIB = 1024
DEVICE_MIB = 80 * GIB
NODES = tuple(
    Node(name=f"gpu{i}", state="idle", gpus=4, shards=16, partitions=("gpu",)) for i in (1, 2)
)


def shard_request(shards: int) -> GpuRequest:
    return GpuRequest(shards=shards, shards_per_node=shards, sources=("tres_per_node",))


def pending(job_id: int, *, comment: str = "", name: str = "light", **extra: object) -> Job:
    fields: dict[str, object] = {
        "job_id": job_id,
        "name": name,
        "user": "alice",
        "state": JobState.PENDING,
        "partition": "gpu",
        "submit_time": T0 - HOUR,
        "node_count": 1,
        "gpus": shard_request(4),
        "comment": comment,
        "requeue": True,
    }
    fields.update(extra)
    return Job(**fields)  # type: ignore[arg-type]


def sharing(
    job_id: int,
    *,
    started: timedelta,
    shards: int = 2,
    node: str = "gpu1",
    index: int = 0,
    whole_gpu: bool = False,
    **extra: object,
) -> Job:
    alloc = (
        NodeGpuAllocation(node, gpu_indices=(index,))
        if whole_gpu
        else NodeGpuAllocation(node, shard_indices=(index,), shards=shards)
    )
    fields: dict[str, object] = {
        "job_id": job_id,
        "name": f"job{job_id}",
        "user": "bob",
        "state": JobState.RUNNING,
        "partition": "gpu",
        "submit_time": T0 - started - MIN,
        "start_time": T0 - started,
        "node_count": 1,
        "nodes": (node,),
        "gpus": GpuRequest(gpus=1, per_node=1) if whole_gpu else shard_request(shards),
        "gpu_allocations": (alloc,),
        "comment": "sgpu:shareable",
        "requeue": True,
    }
    fields.update(extra)
    return Job(**fields)  # type: ignore[arg-type]


def stat(
    util: float, memory_mib: float, *, node: str = "gpu1", index: int = 0, samples: int = 10
) -> GpuStat:
    return GpuStat(
        node=node,
        gpu_index=index,
        samples=samples,
        mean_util_pct=util,
        max_util_pct=util,
        max_memory_mib=memory_mib,
        memory_total_mib=float(DEVICE_MIB),
        trailing_idle=timedelta(0),
        never_busy=False,
        last_sample_at=T0,
    )


def history(name: str, util: float, peak_gpu_mib: float, runs: int = 3) -> list[HistoryRecord]:
    return [
        HistoryRecord(
            user="alice",
            name=name,
            partition="gpu",
            script_hash=None,
            state="COMPLETED",
            run_time=HOUR,
            time_limit=2 * HOUR,
            gpus_requested=1,
            gpus_used=1,
            cpus=4,
            memory_requested_mib=8 * GIB,
            peak_memory_mib=4 * GIB,
            mean_cpu_pct=100.0,
            mean_gpu_util_pct=util,
            peak_gpu_memory_mib=peak_gpu_mib,
            ended_at=T0 - timedelta(days=1),
        )
        for _ in range(runs)
    ]


def snap(
    jobs: Iterable[Job],
    *,
    usage: Mapping[int, Iterable[GpuStat]] | None = None,
    records: Iterable[HistoryRecord] = (),
    version: str = "22.05.8",
    **extra: object,
) -> PolicySnapshot:
    by_job = {j: JobUsage(j, tuple(g)) for j, g in (usage or {}).items()}
    # Agents report the device size: one sample of any job is enough for packing.
    by_job.setdefault(999, JobUsage(999, (stat(0, 0, node="gpu2", index=3),)))
    return PolicySnapshot(
        at=T0,
        cluster=ClusterSnapshot(T0, tuple(jobs), NODES, slurm_version=version),
        usage=by_job,
        history=tuple(records),
        **extra,  # type: ignore[arg-type]
    )


SHAREABLE_8G = "sgpu:shareable sgpu:gpu-mem=8192"


# -- packing --------------------------------------------------------------------------


def test_shareable_light_job_is_narrowed_to_half_a_gpu_of_shards() -> None:
    (action,) = ColocatePolicy().propose(snap([pending(1, comment=SHAREABLE_8G)]))
    assert action.kind == "update"
    assert action.intents == (NarrowToShards(2),)
    assert action.numbers["shards_proposed"] == 2
    assert action.numbers["shards_per_gpu"] == 4
    assert action.numbers["util_source"] == "declared shareable (assumed at the ceiling)"
    assert float(action.numbers["predicted_slowdown"] or 0) <= 1.25
    (newer,) = ColocatePolicy().propose(snap([pending(1, comment=SHAREABLE_8G)], version="24.11.1"))
    assert newer.intents == (NarrowToShards(2),)  # the same on every release


def test_heavy_or_big_or_unknown_jobs_are_never_packed() -> None:
    records = history("heavy", util=90.0, peak_gpu_mib=4 * GIB)
    jobs = [
        pending(1, name="heavy", comment=SHAREABLE_8G),  # history: 90 % util
        pending(2, comment="sgpu:shareable sgpu:gpu-mem=61440"),  # 60 GiB: 4 shards of 4
        pending(3, comment="sgpu:shareable"),  # memory unknown
        pending(4, comment="sgpu:gpu-mem=4096"),  # not shareable, not apply_to_all
        pending(5, comment=SHAREABLE_8G + " sgpu:separated"),  # separated once: never again
        pending(6, comment=SHAREABLE_8G, gpus=shard_request(2)),  # already sharing
        pending(7, comment=SHAREABLE_8G, node_count=2),  # multi-node
    ]
    assert ColocatePolicy().propose(snap(jobs, records=records)) == []


def test_only_the_jobs_own_history_makes_it_light_not_the_users_other_jobs() -> None:
    # Alice's sweep is light (15 %); her "train" job has no history of its own. The
    # user-level prior (15 %, 6 GiB) must not get it packed: it may be a heavy run.
    records = history("sweep", util=15.0, peak_gpu_mib=6 * GIB)
    gpu_job = pending(1, name="train", gpus=GpuRequest(gpus=1, per_node=1))
    policy = ColocatePolicy(ColocateSettings(apply_to_all=True, convert_gpu_requests="always"))
    assert policy.propose(snap([gpu_job], records=records)) == []
    # Declared shareable (and its memory), it is packed at the assumed ceiling instead.
    declared = pending(2, name="train", comment=SHAREABLE_8G)
    (action,) = policy.propose(snap([declared], records=records))
    assert action.numbers["util_source"] == "declared shareable (assumed at the ceiling)"
    assert action.numbers["gpu_memory_mib"] == 8 * GIB
    # Its own history, once there, decides.
    own = records + history("train", util=85.0, peak_gpu_mib=6 * GIB)
    assert policy.propose(snap([gpu_job, declared], records=own)) == []


def test_memory_sets_the_shard_count_so_the_gpu_never_overflows() -> None:
    # 30 GiB of 78 usable: ceil(4 * 30 / 78) = 2 shards; 50 GiB: 3 shards.
    actions = ColocatePolicy().propose(
        snap(
            [
                pending(1, comment="sgpu:shareable sgpu:gpu-mem=30720"),
                pending(2, comment="sgpu:shareable sgpu:gpu-mem=51200"),
            ]
        )
    )
    by_job = {a.job_id: a.intents for a in actions}
    assert by_job == {1: (NarrowToShards(2),), 2: (NarrowToShards(3),)}


def test_history_decides_for_jobs_that_did_not_opt_in_when_apply_to_all() -> None:
    records = history("light", util=15.0, peak_gpu_mib=6 * GIB)
    gpu_job = pending(1, gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)))
    policy = ColocatePolicy(ColocateSettings(apply_to_all=True))
    # 22.05 refuses gres/gpu -> gres/shard on a pending job: not proposed unless forced.
    assert policy.propose(snap([gpu_job], records=records)) == []
    (action,) = policy.propose(snap([gpu_job], records=records, version="24.11.1"))
    assert action.intents == (NarrowToShards(2),)
    assert action.numbers["util_source"] == "history"
    assert action.numbers["gpu_memory_mib"] == 6 * GIB
    forced = ColocatePolicy(ColocateSettings(apply_to_all=True, convert_gpu_requests="always"))
    assert len(forced.propose(snap([gpu_job], records=records))) == 1
    assert ColocatePolicy().propose(snap([gpu_job], records=records, version="24.11.1")) == []


def test_declared_memory_below_the_history_peak_does_not_count() -> None:
    records = history("light", util=20.0, peak_gpu_mib=50 * GIB)
    (action,) = ColocatePolicy().propose(snap([pending(1, comment=SHAREABLE_8G)], records=records))
    assert action.numbers["gpu_memory_mib"] == 50 * GIB
    assert action.intents == (NarrowToShards(3),)


def test_strict_slowdown_bound_keeps_even_light_jobs_whole() -> None:
    policy = ColocatePolicy(ColocateSettings(max_slowdown=1.01))
    assert policy.propose(snap([pending(1, comment=SHAREABLE_8G)])) == []


def test_no_device_memory_known_means_no_packing() -> None:
    plain = PolicySnapshot(
        at=T0, cluster=ClusterSnapshot(T0, (pending(1, comment=SHAREABLE_8G),), NODES)
    )
    assert ColocatePolicy().propose(plain) == []
    sized = ColocatePolicy(ColocateSettings(device_memory_mib=16 * GIB))
    (action,) = sized.propose(plain)
    assert action.numbers["device_memory_mib"] == 16 * GIB


# -- separation -----------------------------------------------------------------------


def test_growing_memory_separates_the_newer_sharer_onto_a_whole_gpu() -> None:
    older, newer = sharing(10, started=HOUR), sharing(11, started=10 * MIN, comment="x")
    usage = {10: [stat(20, 8 * GIB)], 11: [stat(20, 66 * GIB)]}  # 74 of 80 GiB: 92 %
    (action,) = ColocatePolicy().propose(snap([older, newer], usage=usage))
    assert action.kind == "requeue"
    assert action.job_id == 11
    assert action.protective
    assert action.intents == (NarrowToShards(4), SetComment("x sgpu:separated"))
    assert action.numbers["memory_used_mib"] == 74 * GIB
    assert action.numbers["memory_fraction"] == pytest.approx(0.925)
    assert "the newest sharer" in action.reason


def test_light_pair_within_memory_is_left_together() -> None:
    jobs = [sharing(10, started=HOUR), sharing(11, started=MIN)]
    usage = {10: [stat(25, 8 * GIB)], 11: [stat(20, 10 * GIB)]}
    assert ColocatePolicy().propose(snap(jobs, usage=usage)) == []


def test_predicted_slowdown_past_the_bound_separates() -> None:
    jobs = [sharing(10, started=HOUR), sharing(11, started=MIN)]
    usage = {10: [stat(80, 4 * GIB)], 11: [stat(70, 4 * GIB)]}
    (action,) = ColocatePolicy().propose(snap(jobs, usage=usage))
    assert action.job_id == 11
    assert float(action.numbers["worst_predicted_slowdown"] or 0) > 1.25


def test_a_whole_gpu_job_slurm_put_on_a_shared_gpu_stays_and_the_sharer_moves() -> None:
    heavy = sharing(12, started=MIN, whole_gpu=True, comment="")  # the newest, but whole
    light = sharing(10, started=HOUR)
    usage = {12: [stat(95, 30 * GIB)], 10: [stat(30, 4 * GIB)]}
    (action,) = ColocatePolicy().propose(snap([heavy, light], usage=usage))
    assert action.job_id == 10


def test_a_job_that_cannot_be_requeued_gets_a_notice() -> None:
    jobs = [sharing(10, started=HOUR), sharing(11, started=MIN, requeue=False)]
    usage = {10: [stat(20, 40 * GIB)], 11: [stat(20, 40 * GIB)]}
    (action,) = ColocatePolicy().propose(snap(jobs, usage=usage))
    assert (action.kind, action.job_id) == ("warn", 11)
    assert "cannot be requeued" in action.reason


def test_too_few_samples_or_an_earlier_separation_mean_no_new_one() -> None:
    jobs = [sharing(10, started=HOUR), sharing(11, started=10 * MIN)]
    few = {10: [stat(20, 40 * GIB, samples=2)], 11: [stat(20, 40 * GIB, samples=2)]}
    assert ColocatePolicy().propose(snap(jobs, usage=few)) == []
    usage = {10: [stat(20, 40 * GIB)], 11: [stat(20, 40 * GIB)]}
    done = [alert(11, ALERT_SEPARATE, T0 - MIN, policy="colocate")]
    assert ColocatePolicy().propose(snap(jobs, usage=usage, alerts=tuple(done))) == []
    before_this_run = [alert(11, ALERT_SEPARATE, T0 - HOUR, policy="colocate")]
    assert len(ColocatePolicy().propose(snap(jobs, usage=usage, alerts=tuple(before_this_run))))


def test_engine_lets_a_separation_through_the_cooldown_of_the_packing() -> None:
    jobs = [sharing(10, started=HOUR), sharing(11, started=5 * MIN)]
    usage = {10: [stat(20, 40 * GIB)], 11: [stat(20, 40 * GIB)]}
    pack_later = pending(12, comment=SHAREABLE_8G)
    engine = PolicyEngine([(ColocatePolicy(), Mode.ENFORCE)])
    recent = {11: T0 - 5 * MIN, 12: T0 - 5 * MIN}  # both changed 5 min ago (cooldown 30)
    decisions = {
        d.action.job_id: d
        for d in engine.decide(snap([*jobs, pack_later], usage=usage, last_action_at=recent))
    }
    assert decisions[11].execute and not decisions[11].suppressed
    assert decisions[12].suppressed.startswith("cooldown")


# -- actuation ------------------------------------------------------------------------


def _separation_decisions() -> list[object]:
    jobs = [sharing(10, started=HOUR), sharing(11, started=5 * MIN)]
    usage = {10: [stat(20, 40 * GIB)], 11: [stat(20, 40 * GIB)]}
    return list(PolicyEngine([(ColocatePolicy(), Mode.ENFORCE)]).decide(snap(jobs, usage=usage)))


def test_separation_is_requeue_held_then_update_then_release(store: JobStore) -> None:
    slurm = FakeSlurm([sharing(10, started=HOUR), sharing(11, started=5 * MIN)])
    audit = AuditStore(store.engine)
    (result,) = Actuator(slurm, audit).carry_out(_separation_decisions(), T0)  # type: ignore[arg-type]
    assert result.outcome == "done"
    assert [step for step, _ in slurm.actions] == ["requeuehold", "update", "release"]
    assert "NarrowToShards(shards=4)" in slurm.actions[1][1]
    (row,) = audit.list(policy="colocate")
    assert row.kind == "requeue" and row.outcome == "done"
    assert row.numbers["memory_used_mib"] == 80 * GIB


def test_a_refused_update_still_releases_the_job_and_is_audited_failed(store: JobStore) -> None:
    slurm = FakeSlurm([sharing(10, started=HOUR), sharing(11, started=5 * MIN)])
    slurm.update_fails_with = SlurmCommandError("Invalid generic resource (gres) specification")
    audit = AuditStore(store.engine)
    (result,) = Actuator(slurm, audit).carry_out(_separation_decisions(), T0)  # type: ignore[arg-type]
    assert result.outcome == "failed"
    assert "Invalid generic resource" in (result.error or "")
    assert slurm.actions[-1] == ("release", "11")


def test_a_separation_interrupted_by_a_daemon_stop_is_released_on_start(store: JobStore) -> None:
    audit = AuditStore(store.engine)
    audit.record(_separation_decisions(), T0)  # type: ignore[arg-type]  # pending: died here
    slurm = FakeSlurm([sharing(11, started=5 * MIN)])
    assert Actuator(slurm, audit).recover() == 1
    assert [step for step, _ in slurm.actions] == ["update", "release"]
    (row,) = audit.list(policy="colocate")
    assert row.outcome == "failed"


# -- hints and settings ---------------------------------------------------------------


def test_hints_are_whole_tokens() -> None:
    assert hints_from_comment("sgpu:shareable,sgpu:gpu-mem=8192") == ColocateHints(
        True, 8192, False
    )
    assert hints_from_comment("not-sgpu:shareable sgpu:gpu-mem=8G") == ColocateHints()
    assert hints_from_comment("") == ColocateHints()


def test_gpu_mem_option_is_taken_out_before_the_script(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("")
    assert take_gpu_mem(("--gpu-mem", "8GiB", "-J", "x", str(script), "--gpu-mem", "1G")) == (
        8192,
        ("-J", "x", str(script), "--gpu-mem", "1G"),
    )
    assert take_gpu_mem(("--gpu-mem=512MiB", "--wrap", "true")) == (512, ("--wrap", "true"))
    with pytest.raises(ValueError, match="not a size"):
        take_gpu_mem(("--gpu-mem", "lots", "--wrap", "true"))
    with pytest.raises(ValueError, match="needs a size"):
        take_gpu_mem(("--gpu-mem",))


def test_colocate_table_is_read_with_one_line_errors(tmp_path: Path) -> None:
    s = parse_settings(
        '[daemon]\nmode = "enforce"\n[policy.colocate]\nmemory_margin = "4GiB"\n'
        'device_memory = "40GiB"\nmax_slowdown = 1.5\n',
        tmp_path / "c.toml",
    )
    c = s.policy.colocate
    assert (c.mode, s.policy.sizing.memory_margin_mib, c.device_memory_mib, c.max_slowdown) == (
        Mode.ENFORCE,
        4096,
        40960,
        1.5,
    )
    with pytest.raises(ConfigError, match=r"line 3: policy.colocate.memory_margin must be a size"):
        parse_settings('[policy.colocate]\n\nmemory_margin = "lots"\n', tmp_path / "c.toml")
    with pytest.raises(ConfigError, match=r"line 2: policy.colocate.max_jobs_per_gpu must be"):
        parse_settings("[policy.colocate]\nmax_jobs_per_gpu = 1\n", tmp_path / "c.toml")
    with pytest.raises(PolicyConfigError, match="not a known setting"):
        ColocateSettings.from_mapping({"max_job_per_gpu": 2})


def test_policy_is_fast_enough_for_the_simulator() -> None:
    # Not a timing assertion: the policy touches each job a bounded number of times, so a
    # snapshot of 20,000 pending and 2,000 sharing jobs is one pass (bench for figures).
    jobs: list[Job] = [pending(i, comment=SHAREABLE_8G) for i in range(20_000)]
    jobs += [sharing(100_000 + i, started=HOUR, node="gpu1", index=i % 4) for i in range(2_000)]
    actions = ColocatePolicy().propose(snap(jobs))
    assert sum(1 for a in actions if a.kind == "update") == 20_000


def test_reasons_name_each_job_with_its_own_figures() -> None:
    older, newer = sharing(10, started=HOUR), sharing(11, started=10 * MIN, comment="x")
    usage = {10: [stat(25, 3 * GIB)], 11: [stat(15, 70 * GIB)]}  # 73 of 80 GiB
    (action,) = ColocatePolicy().propose(snap([older, newer], usage=usage))
    assert action.reason.startswith(
        "gpu1 GPU 0 holds job 10 (25 % util, 3.0 GiB), job 11 (15 % util, 70.0 GiB); "
        "together 73.0 of 80.0 GiB (91%): job 11 (the newest sharer) separated"
    )
    assert "40 %" not in action.reason, "utilisations are never summed into one figure"
    hot = [sharing(10, started=HOUR), sharing(11, started=MIN), sharing(12, started=HOUR)]
    usage = {10: [stat(80, 4 * GIB)], 11: [stat(70, 5 * GIB)]}
    (action,) = ColocatePolicy().propose(snap(hot, usage=usage))
    assert "job 12 (no samples yet)" in action.reason
    model = ColocatePolicy().model
    own = {10: slowdown_with(80, [70], model), 11: slowdown_with(70, [80], model)}
    slowest = max(own, key=lambda j: own[j])
    assert f"job {slowest} predicted {own[slowest]:.2f}x slower beside the others" in action.reason
    assert "(bound 1.25x)" in action.reason


def test_a_packing_reason_says_where_its_figures_come_from() -> None:
    declared = pending(1, comment=SHAREABLE_8G)
    from_history = pending(2, comment="sgpu:shareable", name="light")
    records = history("light", 20, 3 * GIB)
    by_job = {
        a.job_id: a.reason
        for a in ColocatePolicy().propose(snap([declared, from_history], records=records))
    }
    assert by_job[1].startswith(
        "light job: GPU util 20 % (its past runs), 8.0 GiB GPU memory (declared with --gpu-mem)"
    )
    assert by_job[2].startswith(
        "light job: GPU util 20 % (its past runs), 3.0 GiB GPU memory (peak of its past runs)"
    )
