"""``sgpu report`` counts MIG slices and MPS shares as the share of a GPU they are.

Hand-computed (slurmgpu/gpushare.py's rule), window 2026-03-01 to 03-08:

  201 alice: one ``1g.10gb`` slice, 7 h, util 50 % -> 1/7 x 7 = 1 GPU-h, used 0.5
  202 alice: two ``3g.40gb`` slices, 3.5 h, util 80 % -> 6/7 x 3.5 = 3 GPU-h, used 2.4
  203 bob: ``mps:50`` on nodes with 400 mps over 4 GPUs (100 a GPU), 2 h, util unknown
      (an MPS client sharing its GPU) -> 0.5 x 2 = 1 GPU-h allocated, usage unknown
  204 bob: an A30 ``2g.12gb+me`` slice (4 compute slices a board), 4 h, util 25 %
      -> 2/4 x 4 = 2 GPU-h, used 0.5
  205 carol: one whole GPU, 1 h, util 10 % -> 1 GPU-h, used 0.1
Allocated 8 GPU-h, of which 7 with known usage, used 3.5.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, insert

from slurmgpu.gpushare import mig_gpu_fraction, share_fraction
from slurmgpu.report.build import build_report
from slurmgpu.report.render import to_json
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage import UsageStore
from tests.unit.report_store import SINCE, UNTIL, _at, _gpu, _job, _summary

approx = pytest.approx


def _fill(engine: Engine) -> None:
    def ran(day: int, hours: float) -> dict[str, object]:
        return {"start_time": _at(day), "end_time": _at(day, hours)}

    jobs = [
        _job(201, "alice", "a", "gpu", gpus=1, gpu_type="1g.10gb", **ran(2, 7)),
        _job(202, "alice", "a", "gpu", gpus=2, gpu_type="3g.40gb", **ran(3, 3.5)),
        _job(203, "bob", "b", "gpu", mps=50, mps_per_node=50, **ran(4, 2)),
        _job(204, "bob", "b", "gpu", gpus=1, gpu_type="2g.12gb+me", **ran(5, 4)),
        _job(205, "carol", "a", "gpu", gpus=1, **ran(6, 1)),
    ]
    jobs = [{"gpu_type": None, "mps": 0, "mps_per_node": None, **j} for j in jobs]
    nodes = [
        {"cluster": "", "name": "gpu2", "state": "idle", "gpus": 8, "mps": 0, "last_seen": SINCE},
        {"cluster": "", "name": "gpu3", "state": "idle", "gpus": 4, "mps": 400, "last_seen": SINCE},
    ]
    with engine.begin() as conn:
        conn.execute(insert(schema.jobs), jobs)
        conn.execute(insert(schema.nodes), nodes)
    usage = UsageStore(engine)
    usage.save_summary(201, _summary(7 * 3600, 1, [_gpu(50.0)], None), _at(2, 7.01))
    usage.save_summary(202, _summary(3.5 * 3600, 2, [_gpu(80.0)] * 2, None), _at(3, 3.6))
    unknown = {**_gpu(0.0, never_busy=True), "util_pct_mean": None, "shared": True}
    mps_summary = {**_summary(2 * 3600, 0, [unknown], None), "energy": {"energy_j": 360000.0}}
    usage.save_summary(203, mps_summary, _at(4, 2.01))
    usage.save_summary(204, _summary(4 * 3600, 1, [_gpu(25.0)], None), _at(5, 4.01))
    usage.save_summary(205, _summary(3600, 1, [_gpu(10.0)], None), _at(6, 1.01))


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    store = open_store(store_url)
    _fill(store.engine)
    yield store.engine
    store.engine.dispose()


def test_the_fraction_rule() -> None:
    assert mig_gpu_fraction("1g.10gb") == approx(1 / 7)
    assert mig_gpu_fraction("3g.40gb+me") == approx(3 / 7)
    assert mig_gpu_fraction("7g.80gb") == 1.0
    assert mig_gpu_fraction("1g.20gb") == approx(1 / 7)  # compute slices, not memory
    assert mig_gpu_fraction("4g.24gb") == 1.0  # the A30's whole board
    assert mig_gpu_fraction("a100") is None and mig_gpu_fraction(None) is None
    assert share_fraction(50, 100) == 0.5 and share_fraction(25, 0) == 0.0


@pytest.mark.parametrize("rollups", [True, False])
def test_slices_and_mps_count_as_the_share_of_a_gpu_they_hold(
    engine: Engine, rollups: bool
) -> None:
    r = build_report(engine, since=SINCE, until=UNTIL, now=UNTIL, rollups=rollups)
    t = r.totals
    assert t.jobs == 5 and t.jobs_with_usage == 4  # the MPS job is in, its use unknown
    assert t.gpu_hours_allocated == approx(8.0)
    assert t.gpu_hours_with_usage == approx(7.0)
    assert t.gpu_hours_used == approx(3.5)
    assert r.mps_per_gpu == 100.0
    by_user = {g.name: g.figures for g in r.groups}
    assert by_user["alice"].gpu_hours_allocated == approx(4.0)
    assert by_user["bob"].gpu_hours_allocated == approx(3.0)
    assert by_user["bob"].gpu_hours_used == approx(0.5)
    assert r.energy is not None and r.energy.totals.jobs == 5  # the MPS job's energy too
    assert r.energy.totals.kwh == approx(0.1)
    doc = to_json(r)
    assert doc["mps_per_gpu"] == 100.0
    assert doc["totals"]["gpu_hours_allocated"] == approx(8.0)
