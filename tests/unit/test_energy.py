"""Per-job GPU energy: measured in the store from real samples, shown by eff and summaries."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from slurmgpu.cli.context import AppContext
from slurmgpu.cli.eff import eff as eff_command
from slurmgpu.daemon.summary import build_summary
from slurmgpu.report.eff import job_efficiency
from slurmgpu.report.eff_advice import notes
from slurmgpu.report.energy import JobEnergy, energy_from_json, job_energy
from slurmgpu.store import open_store
from slurmgpu.store.summary_columns import energy_columns
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch
from tests.unit.eff_records import T0, make_job, store_job

STEP_S = 10


def _samples(
    job_id: int | None,
    gpu: int,
    powers: list[float],
    utils: list[float],
    *,
    counter: bool,
    start_mj: int = 5_000_000,
    shared: bool = False,
    tag: str = "",
) -> list[GpuSampleIn]:
    """One sample every STEP_S s; the counter integrates each power held until the next."""
    out: list[GpuSampleIn] = []
    mj = start_mj
    for i, (power, util) in enumerate(zip(powers, utils, strict=True)):
        if i:
            mj += round(powers[i - 1] * STEP_S * 1000)
        out.append(
            GpuSampleIn(
                sample_uid=f"{tag}{job_id}-{gpu}-{i}",
                at=(T0 + timedelta(seconds=STEP_S * i)).timestamp(),
                gpu_index=gpu,
                job_id=job_id,
                util_pct=util,
                power_w=power,
                energy_mj=mj if counter else None,
                shared=shared,
                processes=1,
                source="process",
            )
        )
    return out


@pytest.fixture
def usage(tmp_path: Path) -> UsageStore:
    store = open_store(f"sqlite:///{tmp_path / 'e.db'}")
    return UsageStore(store.engine, store.cluster)


def test_counter_deltas_are_the_energy_and_idle_intervals_are_separated(usage: UsageStore) -> None:
    powers = [100.0, 400.0, 400.0, 80.0, 80.0]
    utils = [0.0, 90.0, 90.0, 0.0, 0.0]
    usage.ingest(SampleBatch(node="n1", gpu=_samples(7, 0, powers, utils, counter=True)))
    (g,) = usage.gpu_energy(7)
    # counter: each power held for STEP_S until the next sample
    assert g.energy_j == pytest.approx((100 + 400 + 400 + 80) * STEP_S)
    # the intervals closing on an idle sample (util 0): 400 W held, then 80 W held
    assert g.idle_energy_j == pytest.approx((400 + 80) * STEP_S)
    assert (g.counter_intervals, g.power_intervals, g.samples) == (4, 0, 5)


def test_without_a_counter_power_samples_are_integrated(usage: UsageStore) -> None:
    powers = [100.0, 300.0, 300.0]
    usage.ingest(SampleBatch(node="n1", gpu=_samples(8, 0, powers, [50.0] * 3, counter=False)))
    (g,) = usage.gpu_energy(8)
    assert g.energy_j == pytest.approx((100 + 300) / 2 * STEP_S + 300 * STEP_S)
    assert (g.counter_intervals, g.power_intervals, g.idle_energy_j) == (0, 2, 0.0)


def test_a_counter_reset_falls_back_to_power_for_that_interval(usage: UsageStore) -> None:
    samples = _samples(9, 0, [200.0] * 3, [50.0] * 3, counter=True)
    samples[2] = msgspec.structs.replace(
        samples[2], energy_mj=10
    )  # driver reloaded: the counter restarted
    usage.ingest(SampleBatch(node="n1", gpu=samples))
    (g,) = usage.gpu_energy(9)
    assert g.energy_j == pytest.approx(2 * 200 * STEP_S)
    assert (g.counter_intervals, g.power_intervals) == (1, 1)
    energy = job_energy(make_job(job_id=9), [g], T0)
    assert energy is not None and energy.method == "mixed"


def test_a_shared_gpu_is_split_between_the_jobs_on_it(usage: UsageStore) -> None:
    powers, utils = [300.0] * 3, [60.0] * 3
    a = _samples(10, 0, powers, utils, counter=True, shared=True, tag="a")
    b = _samples(11, 0, powers, utils, counter=True, shared=True, tag="b")
    usage.ingest(SampleBatch(node="n1", gpu=a + b))
    (ga,) = usage.gpu_energy(10)
    (gb,) = usage.gpu_energy(11)
    assert ga.energy_j == pytest.approx(300 * STEP_S) == gb.energy_j  # half of 2 x 3000 J


def test_job_energy_adds_the_unsampled_head_and_tail(usage: UsageStore) -> None:
    powers = [200.0] * 7  # samples at 0..60 s
    usage.ingest(SampleBatch(node="n1", gpu=_samples(12, 0, powers, [90.0] * 7, counter=True)))
    job = replace(
        make_job(job_id=12),
        start_time=T0 - timedelta(seconds=4),
        end_time=T0 + timedelta(seconds=66),
    )
    energy = job_energy(job, usage.gpu_energy(12), T0)
    assert energy is not None
    assert energy.energy_j == pytest.approx(200 * 70)  # 70 s of life at 200 W
    assert energy.extrapolated_j == pytest.approx(200 * 10)
    assert energy.method == "counter"


def test_energy_note_says_how_much_went_to_idle_gpus() -> None:
    job = replace(make_job(job_id=13), start_time=T0, end_time=T0 + timedelta(hours=2))
    e = JobEnergy(41 * 3.6e6, 0.6 * 41 * 3.6e6, "counter", 0.0, 1)
    eff = job_efficiency(job, [], [], T0 + timedelta(days=1), energy=e)
    (note,) = [n for n in notes(eff) if n.kind == "energy"]
    assert note.severity == "warn"
    assert "41.0 kWh" in note.text and "60 % of it while the GPUs were idle" in note.text
    assert "NVML energy counter" in note.text
    low = JobEnergy(3.6e6, 0.1 * 3.6e6, "power", 0.0, 1)
    (info,) = [n for n in notes(replace(eff, energy=low)) if n.kind == "energy"]
    assert info.severity == "info" and "estimated from power samples" in info.text


def test_summary_and_eff_carry_the_energy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGPU_DB", raising=False)
    monkeypatch.delenv("SGPU_CONFIG", raising=False)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    job = replace(
        make_job(job_id=14, gpus={"n1": (0,)}),
        start_time=T0,
        end_time=T0 + timedelta(seconds=600),
    )
    store = store_job(url, job)
    usage = UsageStore(store.engine, store.cluster)
    n = 61
    powers = [500.0] * 30 + [80.0] * 31
    utils = [95.0] * 30 + [0.0] * 31
    usage.ingest(SampleBatch(node="n1", gpu=_samples(14, 0, powers, utils, counter=True)))

    summary = build_summary(job, usage)
    stored = energy_from_json(summary["energy"])
    assert stored is not None and stored.method == "counter"
    assert stored.energy_j == pytest.approx(sum(powers[:-1]) * STEP_S)
    assert energy_columns(summary)["energy_j"] == pytest.approx(stored.energy_j)
    assert n * STEP_S - STEP_S == 600

    config = tmp_path / "config.toml"
    config.write_text("")
    app = AppContext(config_path=config, db_override=url)
    result = CliRunner().invoke(eff_command, ["14", "--json"], obj=app)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["energy"]["method"] == "counter"
    assert data["energy"]["energy_j"] == pytest.approx(stored.energy_j, rel=1e-6)
    # idle: 30 x 10 s at 80 W + the 500 W interval that closed on the first idle sample
    assert data["energy"]["idle_pct"] == pytest.approx(100 * 29_000 / 174_000, abs=0.1)
    text = CliRunner().invoke(eff_command, ["14"], obj=app).output
    assert "GPU energy" in text and "NVML energy counter" in text


def test_the_head_and_tail_take_the_power_of_the_nearest_sample(usage: UsageStore) -> None:
    powers = [80.0] + [400.0] * 5 + [80.0]  # idle at both ends, like a job's start and end
    utils = [0.0] + [90.0] * 5 + [0.0]
    usage.ingest(SampleBatch(node="n1", gpu=_samples(15, 0, powers, utils, counter=True)))
    job = replace(
        make_job(job_id=15),
        start_time=T0 - timedelta(seconds=5),
        end_time=T0 + timedelta(seconds=65),
    )
    (g,) = usage.gpu_energy(15)
    assert (g.first_power_w, g.last_power_w) == (80.0, 80.0)
    energy = job_energy(job, [g], T0)
    assert energy is not None
    assert energy.extrapolated_j == pytest.approx(80 * 10)  # not the 331 W mean
    assert energy.energy_j == pytest.approx((80 + 5 * 400) * STEP_S + 800)
