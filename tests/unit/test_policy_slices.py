"""Choosing a GPU share by measured util and memory: MIG slice, MPS share, shards or whole;
co-location narrowing pending jobs to it; the interference model's isolation."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurmgpu.intent import NarrowToMps, NarrowToShards, SetGpus
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node
from slurmgpu.policy.base import GpuStat, HistoryRecord, JobUsage, PolicySnapshot
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.interference import slowdown_shared, slowdown_with
from slurmgpu.policy.settings import ColocateSettings
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.policy.slices import (
    MigProfile,
    PartitionOffer,
    choose_slice,
    converts_request,
    partition_offers,
)
from tests.unit.policy_builders import HOUR, T0

GIB = 1024
DEVICE_MIB = 80 * GIB


def pending(job_id: int, *, comment: str, name: str) -> Job:
    return Job(
        job_id=job_id,
        name=name,
        user="alice",
        state=JobState.PENDING,
        partition="gpu",
        submit_time=T0 - HOUR,
        node_count=1,
        comment=comment,
        requeue=True,
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


def device_seen() -> GpuStat:
    """One sample of some job on gpu1: how the policy learns the device's memory."""
    return GpuStat(
        node="gpu1",
        gpu_index=3,
        samples=10,
        mean_util_pct=0.0,
        max_util_pct=0.0,
        max_memory_mib=0.0,
        memory_total_mib=float(DEVICE_MIB),
        trailing_idle=timedelta(0),
        never_busy=False,
        last_sample_at=T0,
    )


SETTINGS = ColocateSettings()
SIZING = SizingRules()
A100_MIG = tuple(
    p for n in ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb") if (p := MigProfile.parse(n))
)


def choose(util: float, memory_mib: float, offer: PartitionOffer) -> str | None:
    choice = choose_slice(util, memory_mib, offer, DEVICE_MIB, SETTINGS, SIZING)
    return None if choice is None else choice.gres


# -- the interference model's isolation ------------------------------------------------


def test_mig_is_isolated_mps_partly_and_shards_not() -> None:
    partners = [40.0, 40.0]
    shard = slowdown_shared(30, partners, "shard")
    mps = slowdown_shared(30, partners, "mps", sm_share_pct=50)
    mig = slowdown_shared(30, partners, "mig", sm_share_pct=3 / 7 * 100)
    assert shard == slowdown_with(30, partners)
    assert 1.0 == mig < mps < shard
    # a heavier partner slows an MPS client but never a MIG slice
    assert slowdown_shared(30, [90], "mps", 50) > slowdown_shared(30, [10], "mps", 50)
    assert slowdown_shared(30, [90], "mig", 50) == slowdown_shared(30, [10], "mig", 50) == 1.0
    # a share smaller than the job's util caps it, alone or not
    assert slowdown_shared(30, [], "mig", 100 / 7) == pytest.approx(30 / (100 / 7))
    assert slowdown_shared(60, [], "mps", 30) >= 2.0


# -- choosing --------------------------------------------------------------------------


def test_the_smallest_slice_that_holds_memory_and_util_wins() -> None:
    mig = PartitionOffer(A100_MIG)
    assert choose(5, 4 * GIB, mig) == "gpu:1g.10gb:1"
    assert choose(5, 9 * GIB, mig) == "gpu:2g.20gb:1"  # 9 GiB + 2 GiB margin > 10
    assert choose(25, 4 * GIB, mig) == "gpu:2g.20gb:1"  # 1g: 25 % of a GPU on 14 % of SMs
    assert choose(35, 30 * GIB, mig) == "gpu:3g.40gb:1"
    assert choose(5, 50 * GIB, mig) is None  # only the whole 7g.80gb holds it
    assert choose(60, 4 * GIB, mig) is None  # not light


def test_isolation_breaks_ties_and_the_smaller_share_wins_otherwise() -> None:
    everything = PartitionOffer(A100_MIG, mps_per_gpu=100, shards_per_gpu=16)
    assert choose(5, 4 * GIB, everything) == "gpu:1g.10gb:1"  # 1/7 of a GPU
    # too busy for 1g or 2g within 1.25x: 3g is 3/7 < the half MPS and shards take
    assert choose(38, 4 * GIB, everything) == "gpu:3g.40gb:1"
    half = PartitionOffer((), mps_per_gpu=100, shards_per_gpu=16)
    assert choose(20, 4 * GIB, half) == "mps:50"  # half a GPU either way: MPS is isolated more
    assert choose(20, 4 * GIB, PartitionOffer(shards_per_gpu=16)) == "shard:8"


def test_an_mps_share_covers_util_and_memory_and_leaves_room_for_a_partner() -> None:
    sizing = SizingRules(max_jobs_per_gpu=4)
    offer = PartitionOffer(mps_per_gpu=100)
    light = choose_slice(10, 4 * GIB, offer, DEVICE_MIB, SETTINGS, sizing)
    # a partner at the 40 % ceiling holds 40 units: one fits beside 25
    assert light is not None and (light.kind, light.count, light.partners) == ("mps", 25, 1)
    big = choose_slice(10, 38 * GIB, offer, DEVICE_MIB, SETTINGS, sizing)
    assert big is not None and big.count == 49  # ceil(100 * 38 / 78) units of 100
    assert choose_slice(10, 77 * GIB, offer, DEVICE_MIB, SETTINGS, sizing) is None


def test_profiles_and_offers_come_from_the_nodes() -> None:
    assert MigProfile.parse("1g.10gb+me") == MigProfile(1, 10, "1g.10gb+me")
    assert MigProfile.parse("a100") is None and MigProfile.parse(None) is None
    nodes = [
        Node("gpu1", "idle", gpus=4, shards=16, partitions=("gpu",)),
        Node(
            "gpu2",
            "idle",
            gpus=8,
            gpu_types=(("3g.40gb", 2), ("1g.10gb", 6)),
            partitions=("gpu", "mig"),
        ),
        Node("gpu3", "idle", gpus=4, mps=400, partitions=("gpu",)),
        Node("gpu9", "down", gpus=4, mps=200, partitions=("gpu",)),  # not available
    ]
    offers = partition_offers(nodes)
    assert [p.name for p in offers["gpu"].mig_profiles] == ["1g.10gb", "3g.40gb"]
    assert (offers["gpu"].mps_per_gpu, offers["gpu"].shards_per_gpu) == (100, 4)
    assert offers["mig"] == PartitionOffer(offers["gpu"].mig_profiles)


def test_which_requests_slurmctld_lets_change() -> None:
    one = GpuRequest(gpus=1, per_node=1)
    typed = GpuRequest(gpus=1, per_node=1, gpu_type="3g.40gb")
    mps = GpuRequest(mps=100, mps_per_node=100)
    assert not converts_request(one, "mig", "22.05.8") and not converts_request(
        one, "mps", "22.05.8"
    )
    assert not converts_request(typed, "mig", "22.05.8")
    assert converts_request(one, "mig", "26.05.5") and converts_request(one, "mps", "")
    assert converts_request(mps, "mps", "22.05.8") and not converts_request(mps, "mig", "22.05.8")
    assert not converts_request(mps, "mig", "26.05.5")  # its user chose MPS
    assert not converts_request(GpuRequest(gpus=2, per_node=2), "mig", "26.05.5")
    assert not converts_request(one, "shard", "26.05.5")  # shards have their own rule


# -- co-location narrows pending jobs ----------------------------------------------------

MIG_NODES = (
    Node("gpu1", "idle", gpus=4, shards=16, partitions=("gpu",)),
    Node(
        "gpu2",
        "idle",
        gpus=8,
        gpu_types=(("3g.40gb", 2), ("2g.20gb", 2), ("1g.10gb", 4)),
        partitions=("gpu",),
    ),
    Node("gpu3", "idle", gpus=4, mps=400, partitions=("gpu",)),
)


def _snap(
    job_gpus: GpuRequest, version: str, comment: str = "sgpu:shareable sgpu:gpu-mem=4096"
) -> PolicySnapshot:
    job = replace(pending(1, comment=comment, name="light"), gpus=job_gpus)
    return PolicySnapshot(
        at=T0,
        cluster=ClusterSnapshot(T0, (job,), MIG_NODES, slurm_version=version),
        usage={999: JobUsage(999, (device_seen(),))},
        history=tuple(history("light", util=8.0, peak_gpu_mib=3 * GIB)),
    )


def test_a_light_gpu_job_is_narrowed_to_a_mig_slice_where_slurm_allows() -> None:
    one = GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",))
    (action,) = ColocatePolicy().propose(_snap(one, "26.05.5"))
    assert action.intents == (SetGpus(1, "1g.10gb"),)
    assert action.numbers["slice"] == "gpu:1g.10gb:1"
    assert action.numbers["util_source"] == "history"
    assert "isolated" in action.reason and "instead of 1 GPU" in action.reason
    # 22.05 refuses gpu:1 -> a typed slice or MPS, and shards (convert auto): nothing
    assert ColocatePolicy().propose(_snap(one, "22.05.8")) == []
    # converting to shards is allowed by the site: shards are what is left on 22.05
    always = ColocatePolicy(ColocateSettings(convert_gpu_requests="always"))
    (shards,) = always.propose(_snap(one, "22.05.8"))
    assert shards.intents == (NarrowToShards(2),)  # gpu1: 4 shards a GPU


def test_a_whole_gpus_mps_request_is_narrowed_to_a_share_on_every_release() -> None:
    whole = GpuRequest(mps=100, mps_per_node=100, sources=("tres_per_node",))
    (action,) = ColocatePolicy().propose(_snap(whole, "22.05.8"))
    assert action.intents == (NarrowToMps(50),)
    assert "partly isolated" in action.reason and "instead of 100 MPS" in action.reason
    (newer,) = ColocatePolicy().propose(_snap(whole, "26.05.5"))
    assert newer.intents == (NarrowToMps(50),)  # an MPS job stays MPS, where a slice is smaller


def test_not_opted_in_or_heavy_jobs_keep_their_gpu() -> None:
    one = GpuRequest(gpus=1, per_node=1)
    assert ColocatePolicy().propose(_snap(one, "26.05.5", comment="")) == []
    heavy = _snap(one, "26.05.5")
    heavy = replace(heavy, history=tuple(history("light", util=80.0, peak_gpu_mib=3 * GIB)))
    assert ColocatePolicy().propose(heavy) == []
