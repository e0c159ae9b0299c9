"""Retention: samples older than the cutoff are rolled up per hour and deleted, and every
usage figure the daemon and ``sgpu eff`` read stays what it was."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from slurmgpu.store import JobStore, open_store, schema
from slurmgpu.store.retention import DEFAULT_MAX_SAMPLES, Retention, roll_up_and_prune
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.usage_query import GpuEnergy, GpuUsage, HostUsage
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch

NOW = datetime(2026, 3, 10, 12, 30, tzinfo=UTC)
JOBS = (11, 12, 13)


def _fill(usage: UsageStore, seed: int, start: datetime, hours: int) -> None:
    rng = random.Random(seed)
    seq = 0
    counters: dict[tuple[str, int], int] = {}
    for node in ("gpu1", "gpu2"):
        gpu: list[GpuSampleIn] = []
        host: list[HostSampleIn] = []
        t = start
        while t < start + timedelta(hours=hours):
            for index, job in enumerate((*JOBS, None)):
                seq += 1
                util = rng.choice([0.0, 0.0, 0.4, rng.uniform(0, 100)])
                # The NVML counter: rising, sometimes missing, now and then reset (a
                # driver reload); power sometimes missing (power-only intervals).
                mj = counters.get((node, index), 0) + rng.randint(30_000_000, 300_000_000)
                if rng.random() < 0.02:
                    mj = rng.randint(0, 1000)
                counters[node, index] = mj
                gpu.append(
                    GpuSampleIn(
                        sample_uid=f"{node}:s:{seq}", at=t.timestamp() + rng.random(),
                        gpu_index=index, job_id=job, util_pct=util,
                        memory_used_mib=rng.uniform(0, 80_000), memory_total_mib=81_559.0,
                        processes=rng.randint(0, 3), shared=rng.random() < 0.1,
                        source=rng.choice(["process", "device", "idle", "error"]),
                        power_w=rng.choice([None, rng.uniform(60, 700)]),
                        energy_mj=None if rng.random() < 0.1 else mj,
                    )
                )  # fmt: skip
                if job is not None:
                    host.append(
                        HostSampleIn(
                            sample_uid=f"{node}:h:{seq}", at=t.timestamp(), job_id=job,
                            cpu_pct=rng.uniform(0, 800), cpus_allocated=8,
                            rss_mib=rng.uniform(0, 9000),
                            cgroup_memory_mib=rng.choice([None, rng.uniform(0, 9000)]),
                            iowait_pct=rng.choice([None, rng.uniform(0, 150)]),
                        )
                    )  # fmt: skip
            t += timedelta(minutes=rng.choice([7, 11, 13]))
        usage.ingest(SampleBatch(node=node, gpu=gpu, host=host))


def _figures(
    usage: UsageStore,
) -> tuple[dict[int, list[GpuUsage]], dict[int, list[HostUsage]], dict[int, list[GpuEnergy]]]:
    return (
        usage.gpu_usage_many(list(JOBS)),
        {j: usage.host_usage(j) for j in JOBS},
        usage.gpu_energy_many(list(JOBS)),
    )


def _same(a: Sequence[Any], b: Sequence[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in dataclasses.fields(x):
            field = f.name
            vx, vy = getattr(x, field), getattr(y, field)
            if isinstance(vx, float):
                assert vx == pytest.approx(vy, rel=1e-9), field
            else:
                assert vx == vy, field


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


# slow tier: thousands of samples pruned and summed on SQLite, 2-4 s each
@pytest.mark.slow
@pytest.mark.parametrize(("seed", "max_samples"), [(1, DEFAULT_MAX_SAMPLES), (2, 1)])
def test_pruning_keeps_every_usage_figure(url: str, seed: int, max_samples: int) -> None:
    """Also when each hour is rolled up node by node (``max_samples=1``: one write
    transaction per node and hour), which must change no figure either."""
    store = open_store(url)
    usage = UsageStore(store.engine)
    _fill(usage, seed, NOW - timedelta(days=3), 72)
    before = _figures(usage)
    total = usage.count_samples()
    result = roll_up_and_prune(
        store.engine,
        "",
        now=NOW,
        sample_retention=timedelta(hours=12),
        max_samples=max_samples,
    )
    left = usage.count_samples()
    assert result.deleted == total - left and result.deleted > 0.7 * total
    with store.engine.connect() as conn:
        hours = conn.execute(select(func.count(schema.sample_hours.c.hour.distinct()))).scalar()
    assert hours and result.transactions == hours * (2 if max_samples == 1 else 1)
    assert result.longest_transaction_s > 0
    with store.engine.connect() as conn:
        oldest = conn.execute(select(func.min(schema.samples.c.at))).scalar()
    assert schema.as_utc(oldest) >= NOW - timedelta(hours=13)
    after = _figures(usage)
    for job in JOBS:
        _same(before[0][job], after[0][job])
        _same(before[1][job], after[1][job])
        # Energy (total, idle, counter/power intervals, covered time, mean/first/last
        # power) and mean I/O wait: the same rule, so equal up to float summation order.
        _same(before[2][job], after[2][job])
        assert sum(g.energy_j for g in after[2][job]) > 0
        assert sum(g.counter_intervals for g in after[2][job]) > 0
        assert sum(g.power_intervals for g in after[2][job]) > 0
        assert all(h.mean_iowait_pct is not None for h in after[1][job])
    with store.engine.connect() as conn:
        rolled_j = conn.execute(select(func.sum(schema.sample_hours.c.energy_j))).scalar()
    assert rolled_j and rolled_j > 0  # the pruned samples' energy lives in the rollups
    # A second run finds nothing more to do and changes nothing.
    again = roll_up_and_prune(store.engine, "", now=NOW, sample_retention=timedelta(hours=12))
    assert again.deleted == 0
    _same(after[0][11], _figures(usage)[0][11])


def test_samples_arriving_late_for_a_pruned_hour_still_count(store: JobStore) -> None:
    usage = UsageStore(store.engine)
    _fill(usage, 7, NOW - timedelta(days=2), 24)
    roll_up_and_prune(store.engine, "", now=NOW)
    _fill(usage, 8, NOW - timedelta(days=2), 24)  # a spool emptied after an outage
    expected_n = sum(g.samples for g in usage.gpu_usage(12))
    roll_up_and_prune(store.engine, "", now=NOW)
    assert sum(g.samples for g in usage.gpu_usage(12)) == expected_n
    assert usage.count_samples() == 0


def test_rollups_older_than_their_retention_go_and_a_run_waits_its_interval(
    store: JobStore,
) -> None:
    usage = UsageStore(store.engine)
    _fill(usage, 9, NOW - timedelta(days=200), 5)
    keeper = Retention(store.engine, "", rollup_retention=timedelta(days=180))
    first = keeper.maybe_run(NOW)
    assert first is not None and first.deleted > 0 and first.rollups_deleted > 0
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.sample_hours)).scalar() == 0
    assert keeper.maybe_run(NOW + timedelta(minutes=30)) is None
    assert keeper.maybe_run(NOW + timedelta(hours=1)) is not None


def test_a_shared_gpus_energy_across_pruned_hour_boundaries_is_exact(url: str) -> None:
    """Two jobs share GPU 0 from 02:00 to 10:00, sampled every 10 min at 1 kW (600 kJ a
    sample interval by the counter), idle from 09:00; their host samples carry iowait.
    Pruning everything before 06:00 changes none of their figures."""
    store = open_store(url)
    usage = UsageStore(store.engine)
    start = datetime(2026, 3, 10, 2, 0, tzinfo=UTC)
    gpu: list[GpuSampleIn] = []
    host: list[HostSampleIn] = []
    iowaits: list[float] = []
    for step in range(49):
        at = start + timedelta(minutes=10 * step)
        for job in (21, 22):
            gpu.append(
                GpuSampleIn(
                    sample_uid=f"gpu1:e:{step}:{job}", at=at.timestamp(), gpu_index=0,
                    job_id=job, util_pct=0.0 if at.hour >= 9 else 50.0, power_w=1000.0,
                    energy_mj=600_000_000 * step, shared=True, source="process",
                )
            )  # fmt: skip
        iowaits.append(10.0 if step % 2 else 35.0)
        host.append(
            HostSampleIn(
                sample_uid=f"gpu1:h:{step}", at=at.timestamp(), job_id=21, cpu_pct=100.0,
                cpus_allocated=4, rss_mib=1000.0, iowait_pct=iowaits[-1],
            )
        )  # fmt: skip
    usage.ingest(SampleBatch(node="gpu1", gpu=gpu, host=host))
    before = usage.gpu_energy_many([21, 22])
    result = roll_up_and_prune(store.engine, "", now=NOW, sample_retention=timedelta(hours=6))
    assert result.deleted == 2 * 24 + 24  # 02:00-05:50: 24 steps, two GPU + one host each
    after = usage.gpu_energy_many([21, 22])
    for job in (21, 22):
        _same(before[job], after[job])
        (g,) = after[job]
        assert g.energy_j == pytest.approx(48 * 600_000 / 2)  # half of every interval
        assert g.idle_energy_j == pytest.approx(7 * 600_000 / 2)  # closing 09:00..10:00
        assert (g.counter_intervals, g.power_intervals, g.samples) == (48, 0, 49)
        assert g.covered_s == pytest.approx(48 * 600)
        assert g.first_power_w == g.last_power_w == g.mean_power_w == pytest.approx(500.0)
        assert (g.first_at, g.last_at) == (start, start + timedelta(hours=8))
    (h,) = usage.host_usage(21)
    assert h.mean_iowait_pct == pytest.approx(sum(iowaits) / len(iowaits))
