"""What ingest writes: each column of a GPU and a host sample, read back from the table.

GPU and host samples go through separate INSERTs that bind only their own columns, so
this pins that every field lands in its column and the other kind's columns stay NULL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from slurmgpu.store import open_store, schema
from slurmgpu.store.schema import as_utc
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch

AT = 1_700_000_000.25


def _rows(tmp_path: Path, batch: SampleBatch) -> dict[str, dict[str, object]]:
    store = open_store(f"sqlite:///{tmp_path / 'u.db'}")
    usage = UsageStore(store.engine, cluster="c1")
    assert usage.ingest(batch) == (len(batch.gpu) + len(batch.host), 0)
    with store.engine.connect() as conn:
        rows = conn.execute(select(schema.samples)).mappings().all()
    return {str(r["sample_uid"]): dict(r) for r in rows}


def test_gpu_and_host_fields_land_in_their_columns(tmp_path: Path) -> None:
    gpu = GpuSampleIn(
        sample_uid="gpu1:r:1:3:42",
        at=AT,
        gpu_index=3,
        job_id=42,
        util_pct=87.5,
        memory_used_mib=1234.0,
        memory_total_mib=81920.0,
        power_w=301.0,
        temperature_c=66.0,
        processes=2,
        shared=True,
        source="process",
        energy_mj=5_000,
    )
    host = HostSampleIn(
        sample_uid="gpu1:r:1:h:42",
        at=AT + 1,
        job_id=42,
        cpu_pct=350.0,
        cpus_allocated=8,
        rss_mib=2048.0,
        cgroup_memory_mib=4096.0,
        iowait_pct=3.5,
    )
    rows = _rows(tmp_path, SampleBatch(node="gpu1", gpu=[gpu], host=[host]))
    g, h = rows[gpu.sample_uid], rows[host.sample_uid]
    common = {"cluster": "c1", "node": "gpu1", "job_id": 42}
    assert {k: g[k] for k in common} == common == {k: h[k] for k in common}
    assert (g["kind"], h["kind"]) == ("gpu", "host")
    for name in (
        "gpu_index", "util_pct", "memory_used_mib", "memory_total_mib", "power_w",
        "temperature_c", "processes", "shared", "source", "energy_mj",
    ):  # fmt: skip
        assert g[name] == getattr(gpu, name), name
        assert h[name] is None, name
    for name in ("cpu_pct", "cpus_allocated", "rss_mib", "cgroup_memory_mib", "iowait_pct"):
        assert h[name] == getattr(host, name), name
        assert g[name] is None, name
    assert as_utc(g["at"]) == datetime.fromtimestamp(gpu.at, UTC)
    assert as_utc(h["at"]) == datetime.fromtimestamp(host.at, UTC)


def test_a_time_that_rounds_up_to_the_next_second_is_stored_in_that_second(
    tmp_path: Path,
) -> None:
    at = 1_700_000_000.9999996  # its microseconds round to 1,000,000
    expected = datetime.fromtimestamp(at, UTC)
    assert expected == datetime(2023, 11, 14, 22, 13, 21, tzinfo=UTC)
    sample = GpuSampleIn(sample_uid="gpu1:r:2:0:-", at=at, gpu_index=0)
    rows = _rows(tmp_path, SampleBatch(node="gpu1", gpu=[sample]))
    assert as_utc(rows[sample.sample_uid]["at"]) == expected
