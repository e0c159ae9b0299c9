"""``sgpu eff``'s advice is what the daemon would do (issue 37): for one job's usage and one
site's configuration, eff's ``--gres=shard:N``, ``--mem`` and ``--time`` are the shards
co-location narrows such a job to and the memory and time limit rightsizing sets, or none
where the policy leaves it alone. Both sides are built from one parsed configuration, as
``sgpu eff`` and the daemon build theirs."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.config import PolicySettings, parse_settings
from slurmgpu.intent import NarrowToShards, SetMemoryPerNode, SetTimeLimit
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node
from slurmgpu.policy.base import HistoryRecord, PolicySnapshot
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.report.eff import EffThresholds, job_efficiency
from slurmgpu.report.eff_advice import notes
from slurmgpu.slurm import sbatch
from tests.hypothesis_profiles import examples
from tests.unit.eff_records import ended, host, make_job
from tests.unit.eff_records import gpu as gpu_usage
from tests.unit.policy_builders import T0

LIMIT = timedelta(days=30)  # every request far above the usage: both sides advise
MEMORY_REQUEST_MIB = 10**7


def _site(
    time_headroom: float,
    time_round_min: int,
    min_time_min: int,
    memory_headroom: float,
    memory_round_mib: int,
    margin_mib: int,
    max_jobs: int,
    max_util_pct: int,
    device_mib: int,
) -> PolicySettings:
    return parse_settings(
        "[policy.rightsize]\n"
        "apply_to_all = true\n"
        f"time_headroom = {time_headroom}\n"
        f'time_round = "{time_round_min}m"\n'
        f'min_time_limit = "{min_time_min}m"\n'
        f"memory_headroom = {memory_headroom}\n"
        f"memory_round_mib = {memory_round_mib}\n"
        "[policy.colocate]\n"
        "apply_to_all = true\n"
        f"memory_margin = {margin_mib}\n"
        f"max_jobs_per_gpu = {max_jobs}\n"
        f"max_util_pct = {max_util_pct}\n"
        f"device_memory = {device_mib}\n"
    ).policy


def _policy_advice(
    p: PolicySettings,
    shards_per_gpu: int,
    run_s: int,
    node_peak_mib: int,
    util_pct: int,
    gpu_peak_mib: int,
) -> dict[str, str | None]:
    """What the daemon's rightsize and colocate policies, built as build_policy_cycle
    builds them, propose for a pending job with three past runs of this usage."""
    runs = tuple(
        HistoryRecord(
            user="alice",
            name="train",
            partition="gpu",
            script_hash=None,
            state="COMPLETED",
            run_time=timedelta(seconds=run_s),
            time_limit=LIMIT,
            gpus_requested=1,
            gpus_used=1,
            cpus=4,
            memory_requested_mib=MEMORY_REQUEST_MIB,
            peak_memory_mib=float(node_peak_mib),
            mean_cpu_pct=100.0,
            mean_gpu_util_pct=float(util_pct),
            peak_gpu_memory_mib=float(gpu_peak_mib),
            ended_at=T0 - timedelta(days=1),
            peak_node_memory_mib=float(node_peak_mib),
        )
        for _ in range(3)
    )
    job = Job(
        job_id=1,
        name="train",
        user="alice",
        state=JobState.PENDING,
        partition="gpu",
        submit_time=T0 - timedelta(hours=1),
        time_limit=LIMIT,
        cpus=4,
        memory_mib=MEMORY_REQUEST_MIB,
        node_count=1,
        tasks=1,
        # one whole GPU, in its shards (what a shareable job submits on Slurm 22.05)
        gpus=GpuRequest(
            shards=shards_per_gpu, shards_per_node=shards_per_gpu, sources=("tres_per_node",)
        ),
        requeue=True,
    )
    node = Node(name="gpu1", state="idle", gpus=4, shards=4 * shards_per_gpu, partitions=("gpu",))
    snap = PolicySnapshot(
        at=T0,
        cluster=ClusterSnapshot(T0, (job,), (node,), slurm_version="22.05.8"),
        usage={},
        history=runs,
    )
    rightsize = RightsizePolicy(p.rightsize, sizing=p.sizing).propose(snap)
    colocate = ColocatePolicy(p.colocate, sizing=p.sizing).propose(snap)
    intents = [i for a in (*rightsize, *colocate) for i in a.intents]
    out: dict[str, str | None] = {"shard": None, "memory": None, "time": None}
    for intent in intents:
        if isinstance(intent, NarrowToShards):
            out["shard"] = str(sbatch.shards(intent.shards))
        elif isinstance(intent, SetMemoryPerNode):
            out["memory"] = str(sbatch.mem(intent.mib))
        elif isinstance(intent, SetTimeLimit) and intent.seconds is not None:
            out["time"] = str(sbatch.time_limit(timedelta(seconds=intent.seconds)))
    return out


def _eff_advice(
    p: PolicySettings,
    shards_per_gpu: int,
    run_s: int,
    node_peak_mib: int,
    util_pct: int,
    gpu_peak_mib: int,
    device_mib: int,
) -> dict[str, str | None]:
    """What ``sgpu eff`` advises after one run of this usage, on the same site."""
    done = make_job(
        elapsed=timedelta(seconds=run_s), time_limit=LIMIT, memory_mib=MEMORY_REQUEST_MIB
    )
    report = job_efficiency(
        done,
        [gpu_usage(0, float(util_pct), memory_mib=float(gpu_peak_mib), total_mib=device_mib)],
        [host("gpu1", 100.0, 4, memory_mib=float(node_peak_mib))],
        ended(done),
        thresholds=EffThresholds.for_site(p.sizing, p.colocate, shards_per_gpu),
    )
    options = {n.kind: n.option for n in notes(report)}
    return {kind: options.get(kind) for kind in ("shard", "memory", "time")}


@given(
    run_s=st.integers(min_value=901, max_value=10 * 86400),
    node_peak_mib=st.integers(min_value=1, max_value=400_000),
    util_pct=st.integers(min_value=1, max_value=60),
    device_mib=st.sampled_from([16_384, 24_576, 40_960, 81_559]),
    gpu_fraction=st.floats(min_value=0.001, max_value=1.0),
    shards_per_gpu=st.integers(min_value=2, max_value=16),
    time_headroom=st.integers(min_value=100, max_value=200).map(lambda x: x / 100),
    time_round_min=st.integers(min_value=1, max_value=30),
    min_time_min=st.integers(min_value=1, max_value=60),
    memory_headroom=st.integers(min_value=100, max_value=200).map(lambda x: x / 100),
    memory_round_mib=st.sampled_from([1, 256, 512, 1024]),
    margin_mib=st.integers(min_value=0, max_value=4096),
    max_jobs=st.integers(min_value=2, max_value=4),
    max_util_pct=st.integers(min_value=10, max_value=50),
)
@settings(max_examples=examples(80), deadline=None)
def test_eff_advises_what_the_policies_decide_for_the_same_job_and_site(
    run_s: int,
    node_peak_mib: int,
    util_pct: int,
    device_mib: int,
    gpu_fraction: float,
    shards_per_gpu: int,
    time_headroom: float,
    time_round_min: int,
    min_time_min: int,
    memory_headroom: float,
    memory_round_mib: int,
    margin_mib: int,
    max_jobs: int,
    max_util_pct: int,
) -> None:
    p = _site(
        time_headroom,
        time_round_min,
        min_time_min,
        memory_headroom,
        memory_round_mib,
        margin_mib,
        max_jobs,
        max_util_pct,
        device_mib,
    )
    gpu_peak_mib = max(1, int(gpu_fraction * device_mib))
    usage = (run_s, node_peak_mib, util_pct, gpu_peak_mib)
    policy = _policy_advice(p, shards_per_gpu, *usage)
    eff = _eff_advice(p, shards_per_gpu, *usage, device_mib)
    assert eff == policy
    assert policy["memory"] is not None and policy["time"] is not None  # the case is live


def test_the_issue_37_job_gets_eight_shards_from_both() -> None:
    """4 GiB used of 40 GiB, 16 shards, 2 GiB margin, at most 2 jobs a GPU: ``sgpu eff``
    advised ``shard:2`` while the daemon narrowed the job to 8."""
    p = _site(1.3, 5, 15, 1.2, 256, 2048, 2, 40, 40_960)
    usage = (7200, 8192, 10, 4096)
    assert _policy_advice(p, 16, *usage)["shard"] == "--gres=shard:8"
    assert _eff_advice(p, 16, *usage, 40_960)["shard"] == "--gres=shard:8"
