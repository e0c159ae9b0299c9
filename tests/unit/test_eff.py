"""``sgpu eff``: per-job efficiency figures and the notes users act on."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from slurmgpu.cli.context import AppContext
from slurmgpu.cli.eff import eff as eff_command
from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.policy.settings import ColocateSettings
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.policy.slices import MigProfile, PartitionOffer
from slurmgpu.report.eff import EffThresholds, JobEfficiency, job_efficiency, usage_from_summary
from slurmgpu.report.eff_advice import gpu_diagnosis, notes
from slurmgpu.report.eff_json import to_json
from slurmgpu.report.eff_render import render_report
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch
from tests.unit.eff_records import (
    GIB,
    H100_MIB,
    T0,
    ended,
    gpu,
    host,
    kinds,
    make_job,
    one,
    store_job,
)

# -- figures and GPU notes ----------------------------------------------------------------


def test_a_busy_two_gpu_job_gets_exact_figures_and_no_notes() -> None:
    job = make_job(
        gpus={"gpu1": (0, 1)},
        cpus=8,
        memory_mib=64 * GIB,
        time_limit=timedelta(hours=2, minutes=30),
    )
    report = job_efficiency(
        job,
        [gpu(0, 80.0, memory_mib=30_000.0), gpu(1, 80.0, memory_mib=40_000.0)],
        [host("gpu1", 700.0, 8, memory_mib=50 * GIB)],
        ended(job),
    )
    assert report.elapsed == timedelta(hours=2)
    assert report.time_use_pct == pytest.approx(80.0)
    assert report.cpu_util_pct == pytest.approx(87.5)
    assert report.cpu_memory_use_pct == pytest.approx(50 / 64 * 100)
    assert report.gpu_util_pct == pytest.approx(80.0)
    assert (report.gpus_allocated, report.gpus_busy) == (2, 2)
    assert report.gpu_memory_max_mib == 40_000.0
    assert [g.status for g in report.gpus] == ["ok", "ok"]
    assert notes(report) == []


def test_a_gpu_idle_for_the_last_70_minutes_of_a_running_job_is_an_alert() -> None:
    job = make_job(job_id=101, state=JobState.RUNNING, cpus=1)
    now = T0 + timedelta(hours=3)
    report = job_efficiency(
        job, [gpu(0, 40.0, idle=timedelta(minutes=70))], [host("gpu1", 90.0, 1)], now
    )
    assert report.running and report.elapsed == timedelta(hours=3)
    (g,) = report.gpus
    assert g.status == "idle" and g.ever_busy
    found = notes(report)
    assert kinds(found) == ["idle-gpu"]
    alert = found[0]
    assert alert.severity == "alert"
    assert alert.text.startswith(
        "GPU gpu1:0 has been idle for the last 70 min (the idle-GPU limit is 60 min)"
    )
    assert "scancel 101" in alert.text


def test_a_gpu_idle_for_59_minutes_is_not_yet_an_alert() -> None:
    job = make_job(state=JobState.RUNNING, cpus=1)
    report = job_efficiency(
        job, [gpu(0, 40.0, idle=timedelta(minutes=59))], [], T0 + timedelta(hours=3)
    )
    assert report.gpus[0].status == "ok"
    assert "idle-gpu" not in kinds(notes(report))


def test_a_four_gpu_job_with_one_busy_gpu_is_told_to_ask_for_one() -> None:
    job = make_job(gpus={"gpu1": (0, 1, 2, 3)}, cpus=4)
    usage = [gpu(0, 90.0)] + [gpu(i, 0.0, memory_mib=500.0) for i in (1, 2, 3)]
    report = job_efficiency(job, usage, [host("gpu1", 350.0, 4)], ended(job))
    assert report.gpu_util_pct == pytest.approx(22.5)
    assert (report.gpus_allocated, report.gpus_busy) == (4, 1)
    assert [g.status for g in report.gpus] == ["ok", "idle", "idle", "idle"]
    found = notes(report)
    assert kinds(found) == ["gpus"]
    note = found[0]
    assert note.option == "--gpus=1"
    assert note.severity == "warn"
    assert "only 1 of 4 allocated GPUs was ever busy (gpu1:0)" in note.text
    assert "never busy: gpu1:1, gpu1:2, gpu1:3" in note.text


def test_a_multi_node_job_whose_busy_gpus_are_on_one_node_is_told_to_use_one_node() -> None:
    job = make_job(gpus={"gpu1": (0, 1), "gpu2": (0, 1)}, cpus=8)
    usage = [gpu(0, 70.0), gpu(1, 60.0)] + [
        gpu(i, 0.0, node="gpu2", memory_mib=400.0) for i in (0, 1)
    ]
    report = job_efficiency(
        job, usage, [host("gpu1", 300.0, 4), host("gpu2", 300.0, 4)], ended(job)
    )
    assert one(notes(report), "gpus").option == "--nodes=1 --gpus=2"


def test_an_allocated_gpu_with_no_process_is_shown_as_such_and_counted_as_idle() -> None:
    job = make_job(gpus={"gpu1": (0, 1)}, cpus=2)
    usage = [gpu(0, 85.0), gpu(1, 0.0, memory_mib=0.0, processes=0)]
    report = job_efficiency(job, usage, [host("gpu1", 150.0, 2)], ended(job))
    no_proc = report.gpus[1]
    assert no_proc.status == "no-process"
    assert no_proc.counted_as_zero and not no_proc.ever_busy
    assert report.gpu_util_pct == pytest.approx(42.5)
    assert report.gpus_busy == 1
    note = one(notes(report), "gpus")
    assert note.option == "--gpus=1"
    assert "gpu1:1 (no process)" in note.text


def test_a_running_job_whose_gpu_never_had_a_process_gets_an_alert() -> None:
    job = make_job(state=JobState.RUNNING, cpus=1)
    usage = [gpu(0, 0.0, memory_mib=0.0, processes=0, span=timedelta(minutes=80))]
    report = job_efficiency(job, usage, [], T0 + timedelta(minutes=81))
    assert report.gpus[0].status == "no-process"
    assert report.gpu_util_pct == 0.0
    alert = one(notes(report), "idle-gpu")
    assert alert.text.startswith("GPU gpu1:0 (no process) has been idle for the last 80 min")


def test_a_finished_job_that_never_used_its_gpu_is_an_alert_to_fix_the_program() -> None:
    job = make_job(cpus=1)
    report = job_efficiency(
        job, [gpu(0, 0.0, memory_mib=600.0)], [host("gpu1", 90.0, 1)], ended(job)
    )
    assert report.gpus[0].status == "idle" and not report.gpus[0].ever_busy
    found = notes(report)
    assert kinds(found) == ["no-gpu-use"]
    assert found[0].severity == "alert"
    assert found[0].text.startswith("none of the 1 allocated GPU(s) was ever busy (gpu1:0)")


def test_a_running_job_not_yet_using_its_gpu_after_10_minutes_is_only_warned() -> None:
    job = make_job(state=JobState.RUNNING, cpus=1)
    usage = [gpu(0, 0.0, memory_mib=600.0, span=timedelta(minutes=10))]
    report = job_efficiency(job, usage, [], T0 + timedelta(minutes=10))
    assert [(n.kind, n.severity) for n in notes(report)] == [("no-gpu-use", "warn")]


def test_a_gpu_the_agent_never_reported_on_a_reporting_node_counts_as_zero() -> None:
    job = make_job(gpus={"gpu1": (0, 1)}, cpus=2)
    report = job_efficiency(job, [gpu(0, 60.0)], [host("gpu1", 150.0, 2)], ended(job))
    missing = report.gpus[1]
    assert (missing.status, missing.counted_as_zero) == ("no-data", True)
    assert report.gpu_util_pct == pytest.approx(30.0)
    assert "gpu1:1 (no samples)" in one(notes(report), "gpus").text


def test_a_silent_node_is_not_counted_as_idle_and_the_agent_is_blamed() -> None:
    job = make_job(gpus={"gpu1": (0,), "gpu2": (0,)}, cpus=4)
    report = job_efficiency(job, [gpu(0, 70.0)], [host("gpu1", 200.0, 2)], ended(job))
    assert report.silent_nodes == ("gpu2",)
    assert [(g.label, g.status, g.counted_as_zero) for g in report.gpus] == [
        ("gpu1:0", "ok", False),
        ("gpu2:0", "no-data", False),
    ]
    assert report.gpu_util_pct == pytest.approx(70.0)
    found = notes(report)
    assert one(found, "no-samples").text == (
        "no usage samples from gpu2: is `sgpu agent` running on gpu2?"
    )
    assert "gpus" not in kinds(found)  # gpu2's use is unknown, not zero


def test_error_samples_are_unknown_use_not_idleness() -> None:
    job = make_job(cpus=1)
    usage = [gpu(0, 0.0, memory_mib=0.0, processes=0, errors=240, samples=240)]
    report = job_efficiency(job, usage, [host("gpu1", 90.0, 1)], ended(job))
    assert report.gpus[0].status == "error"
    assert report.gpu_util_pct is None
    assert [n for n in notes(report) if n.severity == "alert"] == []


def test_a_light_one_gpu_job_is_offered_the_shards_the_daemon_would_give_it() -> None:
    """Issue 37's case: 4 GiB used of a 40 GiB GPU of 16 shards, 2 GiB margin, at most 2
    jobs a GPU. eff said ``shard:2`` (ceil(16 * 1.2 * 4 / 40)) where co-location narrows
    the job to 8: now both say 8, the shard rule of the site's SizingRules."""
    job = make_job(cpus=1)
    usage = [gpu(0, 8.0, peak=30.0, memory_mib=4096.0, total_mib=40960.0)]
    report = job_efficiency(job, usage, [host("gpu1", 95.0, 1)], ended(job))
    found = notes(report)
    # starved of data too (its one core 95 % busy): that is still said
    assert sorted(kinds(found)) == ["input-bound", "shard"]
    # max(ceil(16 * 4096 / (40960 - 2048)), ceil(16 / 2)) = max(2, 8)
    shard = one(found, "shard")
    assert shard.option == "--gres=shard:8"
    assert "peaked at 4.0 GiB of 40.0 GiB" in shard.text and "(8 of 16 shards)" in shard.text
    # on the cluster's own shard count (the lab's 4), and the site's margin
    four = notes(replace(report, thresholds=EffThresholds(shards_per_gpu=4)))
    assert one(four, "shard").option == "--gres=shard:2"
    tight = EffThresholds(sizing=SizingRules(memory_margin_mib=38_000))  # 2,960 MiB left
    assert "shard" not in kinds(notes(replace(report, thresholds=tight)))


def test_a_job_the_daemon_would_not_pack_is_not_offered_shards() -> None:
    # 76,000 MiB of an H100 (79,511 usable past the margin) needs all 16 shards
    big = make_job(cpus=1)
    report = job_efficiency(
        big, [gpu(0, 8.0, memory_mib=76_000.0)], [host("gpu1", 95.0, 1)], ended(big)
    )
    assert "shard" not in kinds(notes(report))
    # 8 % GPU with its one core 95 % busy: starved of data, not a GPU to share
    assert one(notes(report), "input-bound").severity == "warn"
    # above [policy.colocate] max_util_pct (40 %): too busy to share
    busy = job_efficiency(big, [gpu(0, 45.0, memory_mib=4096.0)], [], ended(big))
    assert "shard" not in kinds(notes(busy))
    # a job that declared more with --gpu-mem is sized by that, as the daemon does
    declared = replace(big, comment="sgpu:shareable sgpu:gpu-mem=76000")
    small = job_efficiency(declared, [gpu(0, 8.0, memory_mib=4096.0)], [], ended(declared))
    assert "shard" not in kinds(notes(small))


def test_where_the_nodes_offer_mig_or_mps_the_note_names_the_slice() -> None:
    job = make_job(cpus=1)
    usage = [gpu(0, 8.0, peak=30.0, memory_mib=4096.0, total_mib=81920.0)]
    report = job_efficiency(job, usage, [host("gpu1", 20.0, 1)], ended(job))
    mig = PartitionOffer(tuple(p for n in ("1g.10gb", "3g.40gb") if (p := MigProfile.parse(n))))
    found = notes(
        replace(
            report, thresholds=EffThresholds.for_site(SizingRules(), ColocateSettings(), 16, mig)
        )
    )
    note = one(found, "slice")
    assert note.option == "--gres=gpu:1g.10gb:1"
    assert "a MIG slice, 1 of 7 compute slices and 10.0 GiB, isolated" in note.text
    assert "shard" not in kinds(found) and gpu_diagnosis(found) == "low-util"
    # MPS only: a share of the SMs
    mps = EffThresholds.for_site(
        SizingRules(), ColocateSettings(), 16, PartitionOffer(mps_per_gpu=100)
    )
    assert one(notes(replace(report, thresholds=mps)), "slice").option == "--gres=mps:50"
    # an offer of shards alone is the shard note as before
    shards = EffThresholds.for_site(
        SizingRules(), ColocateSettings(), 16, PartitionOffer(shards_per_gpu=16)
    )
    assert shards.offer is None and one(notes(replace(report, thresholds=shards)), "shard")
    # a job that already ran on a slice is told nothing about slices
    on_slice = replace(job, gpus=GpuRequest(gpus=1, per_node=1, gpu_type="3g.40gb"))
    again = job_efficiency(on_slice, usage, [host("gpu1", 20.0, 1)], ended(on_slice))
    with_mig = EffThresholds.for_site(SizingRules(), ColocateSettings(), 16, mig)
    assert not {"slice", "shard"} & set(kinds(notes(replace(again, thresholds=with_mig))))


# -- time, memory, CPU --------------------------------------------------------------------


def test_an_over_asked_time_limit_gets_the_exact_time_to_ask_for() -> None:
    job = make_job(elapsed=timedelta(hours=1, minutes=2), time_limit=timedelta(hours=24))
    report = job_efficiency(job, [gpu(0, 70.0)], [host("gpu1", 380.0, 4)], ended(job))
    note = one(notes(report), "time")
    # 1.3 * 3720 s = 4836 s, rounded up to 5 min: 17 * 300 s = 1:25:00 (policy.sizing, the
    # limit rightsizing would set); 4 % of the limit is red
    assert note.option == "--time=01:25:00"
    assert note.severity == "warn"
    assert "ran 01:02:00, 4% of its 1-00:00:00 limit" in note.text


def test_the_time_suggestion_is_not_pushed_up_by_float_noise() -> None:
    job = make_job(elapsed=timedelta(hours=2, minutes=30), time_limit=timedelta(hours=8))
    report = job_efficiency(job, [gpu(0, 70.0)], [host("gpu1", 380.0, 4)], ended(job))
    note = one(notes(report), "time")
    assert note.option == "--time=03:15:00"  # 1.3 * 9000 s is exactly 13 * 900 s
    assert note.severity == "info"


@pytest.mark.parametrize(
    ("state", "elapsed", "limit"),
    [
        (JobState.RUNNING, timedelta(hours=1), timedelta(hours=24)),
        (JobState.CANCELLED, timedelta(hours=1), timedelta(hours=24)),
        (JobState.COMPLETED, timedelta(minutes=15), timedelta(hours=24)),
        (JobState.COMPLETED, timedelta(hours=3), timedelta(hours=5)),  # 60 % used
        (JobState.COMPLETED, timedelta(hours=1), None),
    ],
)
def test_no_time_note_unless_completed_longer_than_15_min_and_under_60_percent(
    state: JobState, elapsed: timedelta, limit: timedelta | None
) -> None:
    job = make_job(state=state, elapsed=elapsed, time_limit=limit)
    report = job_efficiency(job, [gpu(0, 70.0)], [], T0 + elapsed)
    assert "time" not in kinds(notes(report))


def test_over_asked_memory_gets_the_exact_mem_to_ask_for() -> None:
    job = make_job(memory_mib=256 * GIB)
    report = job_efficiency(
        job, [gpu(0, 70.0)], [host("gpu1", 380.0, 4, memory_mib=5 * GIB)], ended(job)
    )
    note = one(notes(report), "memory")
    assert note.option == "--mem=6G"  # ceil(1.2 * 5 GiB), not 7 from float noise
    assert "used 2% of its 256.0 GiB of memory (peak 5.0 GiB)" in note.text


def test_memory_used_at_70_percent_gets_no_note() -> None:
    job = make_job(memory_mib=10 * GIB)
    report = job_efficiency(
        job, [gpu(0, 70.0)], [host("gpu1", 380.0, 4, memory_mib=7 * GIB)], ended(job)
    )
    assert report.cpu_memory_use_pct == pytest.approx(70.0)
    assert "memory" not in kinds(notes(report))


def test_a_running_job_is_told_what_it_used_so_far() -> None:
    job = make_job(state=JobState.RUNNING, memory_mib=64 * GIB, time_limit=timedelta(days=2))
    report = job_efficiency(
        job,
        [gpu(0, 70.0)],
        [host("gpu1", 380.0, 4, memory_mib=8 * GIB)],
        T0 + timedelta(hours=1),
    )
    note = one(notes(report), "memory")
    assert "has used 12% of its 64.0 GiB of memory so far" in note.text
    # ceil(1.2 * 8192 MiB) = 9831 MiB, rounded up to 256 MiB: 39 * 256 = 9984 MiB
    assert note.option == "--mem=9984M"
    assert "time" not in kinds(notes(report))


def test_a_run_under_five_minutes_gets_no_notes() -> None:
    job = make_job(gpus={"gpu1": (0, 1)}, elapsed=timedelta(minutes=4), memory_mib=256 * GIB)
    usage = [gpu(i, 0.0, span=timedelta(minutes=4)) for i in (0, 1)]
    report = job_efficiency(job, usage, [host("gpu1", 10.0, 4)], ended(job))
    found = notes(report)
    assert kinds(found) == ["short-run"]
    assert found[0].text == (
        "run time 00:04:00 is under 5 min: no efficiency notes for runs this short"
    )


def test_multi_node_cpu_efficiency_weights_nodes_by_their_cores() -> None:
    job = make_job(gpus={"gpu1": (0,), "gpu2": (0,)}, cpus=16, tasks=2)
    report = job_efficiency(
        job,
        [gpu(0, 70.0), gpu(0, 70.0, node="gpu2")],
        [host("gpu1", 1200.0, 12), host("gpu2", 0.0, 4)],
        ended(job),
    )
    assert [(n.node, n.cores, n.cpu_util_pct) for n in report.nodes] == [
        ("gpu1", 12, 100.0),
        ("gpu2", 4, 0.0),
    ]
    assert report.cpu_util_pct == pytest.approx(75.0)  # not the 50 % mean of the nodes
    assert "cpu" not in kinds(notes(report))


def test_low_cpu_use_on_many_cores_suggests_fewer_cores_per_task() -> None:
    job = make_job(gpus={"gpu1": (0,), "gpu2": (0,)}, cpus=32, tasks=2)
    report = job_efficiency(
        job,
        [gpu(0, 70.0), gpu(0, 70.0, node="gpu2")],
        [host("gpu1", 200.0, 16), host("gpu2", 100.0, 16)],
        ended(job),
    )
    assert report.cpu_util_pct == pytest.approx(300 / 32)
    note = one(notes(report), "cpu")
    assert note.option == "-c 3"  # ceil(1.2 * 2 busy cores on the busiest node)
    assert "9% of 32 cores (3.0 busy on average)" in note.text


def test_low_cpu_use_on_few_cores_is_not_a_note() -> None:
    job = make_job(cpus=2)
    report = job_efficiency(job, [gpu(0, 70.0)], [host("gpu1", 20.0, 2)], ended(job))
    assert report.cpu_util_pct == pytest.approx(10.0)
    assert "cpu" not in kinds(notes(report))


def test_a_job_without_samples_reports_what_slurm_knows_and_asks_about_the_agent() -> None:
    job = make_job(elapsed=timedelta(hours=1), time_limit=timedelta(hours=24))
    report = job_efficiency(job, [], [], ended(job))
    assert report.source == "none" and not report.has_samples
    assert report.gpu_util_pct is None and report.cpu_util_pct is None
    assert [(g.label, g.status, g.counted_as_zero) for g in report.gpus] == [
        ("gpu1:0", "no-data", False)
    ]
    found = notes(report)
    assert one(found, "no-samples").text == "no usage samples: is `sgpu agent` running on gpu1?"
    # Slurm's own figures still count: 1.3 * 3600 s = 4680 s -> 16 * 300 s = 1:20:00
    assert one(found, "time").option == "--time=01:20:00"


def test_thresholds_can_be_overridden() -> None:
    job = make_job(state=JobState.RUNNING, cpus=1)
    usage = [gpu(0, 40.0, idle=timedelta(minutes=70))]
    strict = EffThresholds(idle_alert=timedelta(minutes=90))
    now = T0 + timedelta(hours=3)
    assert "idle-gpu" not in kinds(notes(job_efficiency(job, usage, [], now, thresholds=strict)))


def test_a_summary_is_turned_back_into_usage() -> None:
    job = make_job(gpus={"gpu1": (0, 1)}, cpus=4)
    summary = {
        "version": 1,
        "nodes": {
            "gpu1": {
                "host": {"samples": 10, "cpus": 4, "cpu_pct_mean": 200.0, "memory_max_mib": 900},
                "gpus": {
                    "1": {"samples": 10, "util_pct_mean": 0.0, "util_pct_max": 0.0,
                          "memory_max_mib": 0.0, "memory_total_mib": H100_MIB,
                          "idle_trailing_s": 7200, "never_busy": True, "shared": False},
                    "0": {"samples": 10, "util_pct_mean": 55.0, "util_pct_max": 99.0,
                          "memory_max_mib": 12000.0, "memory_total_mib": H100_MIB,
                          "idle_trailing_s": 0, "never_busy": False, "shared": False},
                },
            }
        },
    }  # fmt: skip
    gpus, hosts = usage_from_summary(job, summary)
    assert [(g.gpu_index, g.mean_util_pct) for g in gpus] == [(0, 55.0), (1, 0.0)]
    assert hosts[0].cpu_efficiency_pct == 50.0
    report = job_efficiency(job, gpus, hosts, ended(job), source="summary")
    assert [g.status for g in report.gpus] == ["ok", "no-process"]  # no memory: no process


def test_the_terminal_report_shows_bars_tables_and_notes() -> None:
    job = make_job(gpus={"gpu1": (0, 1, 2, 3)}, cpus=4, memory_mib=64 * GIB)
    usage = [gpu(0, 90.0)] + [gpu(i, 0.0, memory_mib=500.0) for i in (1, 2, 3)]
    report = job_efficiency(job, usage, [host("gpu1", 350.0, 4)], ended(job))
    text = _render(report)
    for expected in (
        "CPU util",
        "88%",
        "GPU util",
        "22%",  # 22.5 rounds to even
        "gpu1[0,1,2,3]",
        "gpu1:3",
        "idle",
        "Notes",
        "--gpus=1",
    ):
        assert expected in text, expected


def _render(report: JobEfficiency) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render_report(report, notes(report)))
    return console.export_text()


# -- the command against a real store -----------------------------------------------------


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, AppContext]:
    monkeypatch.delenv("SGPU_DB", raising=False)
    monkeypatch.delenv("SGPU_CONFIG", raising=False)
    config = tmp_path / "config.toml"
    config.write_text("")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_store(url)
    return url, AppContext(config_path=config, db_override=url)


def _array_task_with_samples(url: str) -> Job:
    job = replace(
        make_job(
            job_id=123,
            gpus={"gpu1": (0, 1)},
            cpus=8,
            memory_mib=64 * GIB,
            time_limit=timedelta(hours=8),
            tasks=1,
        ),
        array_job_id=120,
        array_task_id=3,
    )
    store = store_job(url, job)
    gpu_samples, host_samples = [], []
    for minute in range(121):
        at = (T0 + timedelta(minutes=minute)).timestamp()
        gpu_samples.append(
            GpuSampleIn(
                sample_uid=f"g0-{minute}", at=at, gpu_index=0, job_id=123, util_pct=80.0,
                memory_used_mib=30_000.0, memory_total_mib=H100_MIB, processes=1,
            )
        )  # fmt: skip
        gpu_samples.append(
            GpuSampleIn(
                sample_uid=f"g1-{minute}", at=at, gpu_index=1, job_id=123, util_pct=0.0,
                memory_used_mib=0.0, memory_total_mib=H100_MIB, processes=0, source="idle",
            )
        )  # fmt: skip
        host_samples.append(
            HostSampleIn(
                sample_uid=f"h-{minute}", at=at, job_id=123, cpu_pct=400.0, cpus_allocated=8,
                rss_mib=8 * GIB,
            )
        )  # fmt: skip
    usage = UsageStore(store.engine, store.cluster)
    usage.ingest(SampleBatch(node="gpu1", gpu=gpu_samples, host=host_samples))
    return job


def test_eff_prints_the_figures_and_notes_of_an_array_task(db: tuple[str, AppContext]) -> None:
    url, app = db
    _array_task_with_samples(url)
    result = CliRunner().invoke(eff_command, ["120_3"], obj=app)
    assert result.exit_code == 0, result.output
    out = result.output
    for expected in (
        "120_3 (job id 123)",
        "COMPLETED",
        "02:00:00",
        "08:00:00 (25% used)",
        "50%",  # CPU util: 4 of 8 cores
        "40%",  # GPU util: (80 + 0) / 2
        "no-process",
        "--gpus=1",
        "--mem=9984M",
        "--time=02:40:00",
        "-c 5",
    ):
        assert expected in out, expected


def test_eff_json_has_stable_keys_and_exact_figures(db: tuple[str, AppContext]) -> None:
    url, app = db
    _array_task_with_samples(url)
    result = CliRunner().invoke(eff_command, ["120_3", "--json"], obj=app)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {
        "version", "job", "source", "running", "elapsed_s", "time_use_pct", "cpu", "nodes",
        "gpu", "gpus", "silent_nodes", "energy", "notes",
    }  # fmt: skip
    assert data["energy"] is None  # these samples carry no power: nothing to measure
    assert data["job"]["display_id"] == "120_3" and data["job"]["job_id"] == 123
    assert data["source"] == "samples"
    assert data["elapsed_s"] == 7200 and data["time_use_pct"] == 25.0
    assert data["cpu"] == {
        "util_pct": 50.0,
        "cores": 8,
        "memory_max_mib": 8192.0,
        "memory_node_max_mib": 8192.0,
        "memory_requested_mib": 65536,
        "memory_use_pct": 12.5,
    }
    assert data["gpu"] == {
        "allocated": 2,
        "sharing": "gpu",
        "equivalents": 2.0,
        "busy": 1,
        "util_pct": 40.0,
        "memory_max_mib": 30000.0,
        "memory_use_pct": 36.8,
        "diagnosis": "low-util",  # one of its two GPUs never used: the --gpus=1 note
    }
    assert [(g["index"], g["status"], g["counted_as_zero"]) for g in data["gpus"]] == [
        (0, "ok", False),
        (1, "no-process", True),
    ]
    options = {n["kind"]: n["option"] for n in data["notes"]}
    assert options == {"gpus": "--gpus=1", "cpu": "-c 5", "memory": "--mem=9984M",
                       "time": "--time=02:40:00"}  # fmt: skip


def test_eff_of_a_job_without_samples_uses_the_stored_summary(
    db: tuple[str, AppContext],
) -> None:
    url, app = db
    job = make_job(job_id=200, cpus=4)
    store = store_job(url, job)
    summary = {
        "version": 1,
        "nodes": {
            "gpu1": {
                "host": {"samples": 5, "cpus": 4, "cpu_pct_mean": 300.0, "memory_max_mib": 512},
                "gpus": {"0": {"samples": 5, "util_pct_mean": 66.0, "util_pct_max": 90.0,
                               "memory_max_mib": 20000.0, "memory_total_mib": H100_MIB,
                               "idle_trailing_s": 0, "never_busy": False, "shared": False}},
            }
        },
    }  # fmt: skip
    UsageStore(store.engine, store.cluster).save_summary(200, summary, T0 + timedelta(hours=2))
    result = CliRunner().invoke(eff_command, ["200", "--json"], obj=app)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["source"] == "summary"
    assert data["gpu"]["util_pct"] == 66.0 and data["cpu"]["util_pct"] == 75.0


def _light_job_on_shard_nodes(url: str, config: Path, colocate: str) -> None:
    """A finished 1-GPU job that used 10 % and 4 GiB of a 40 GiB GPU, on a node the store
    knows with 4 shards per GPU, and a site config with ``colocate`` in [policy.colocate]."""
    config.write_text(f"[policy.colocate]\n{colocate}\n")
    job = make_job(job_id=400, cpus=4)
    store = open_store(url)
    node = Node(name="gpu1", state="idle", gpus=4, shards=16, partitions=("gpu",))
    store.apply_cycle(diff_jobs({}, [job]), {}, [node], T0)
    samples = [
        GpuSampleIn(
            sample_uid=f"g-{minute}", at=(T0 + timedelta(minutes=minute)).timestamp(),
            gpu_index=0, job_id=400, util_pct=10.0, memory_used_mib=4096.0,
            memory_total_mib=40960.0, processes=1,
        )
        for minute in range(121)
    ]  # fmt: skip
    UsageStore(store.engine, store.cluster).ingest(SampleBatch(node="gpu1", gpu=samples))


def test_eff_advises_the_clusters_shards_by_the_sites_colocate_settings(
    db: tuple[str, AppContext],
) -> None:
    url, app = db
    assert app.config_path is not None
    _light_job_on_shard_nodes(url, app.config_path, "max_util_pct = 40")
    result = CliRunner().invoke(eff_command, ["400", "--json"], obj=app)
    assert result.exit_code == 0, result.output
    options = {n["kind"]: n["option"] for n in json.loads(result.output)["notes"]}
    # 4 shards per GPU on gpu1 (from the store), at most 2 jobs a GPU: 2 of 4
    assert options["shard"] == "--gres=shard:2"
    strict = AppContext(config_path=app.config_path, db_override=url)
    app.config_path.write_text("[policy.colocate]\nmax_util_pct = 5\n")
    result = CliRunner().invoke(eff_command, ["400", "--json"], obj=strict)
    kinds_seen = {n["kind"] for n in json.loads(result.output)["notes"]}
    assert "shard" not in kinds_seen  # 10 % is too busy to share on this site


def test_eff_names_the_mig_slice_the_partitions_nodes_offer(
    db: tuple[str, AppContext],
) -> None:
    url, app = db
    assert app.config_path is not None
    _light_job_on_shard_nodes(url, app.config_path, "max_util_pct = 40")
    store = open_store(url)
    mig = Node(
        name="gpu2", state="idle", gpus=14, gpu_types=(("1g.10gb", 14),), partitions=("gpu",)
    )
    store.apply_cycle(diff_jobs({}, []), {}, [mig], T0)
    assert store.known_nodes()["gpu2"].gpu_types == (("1g.10gb", 14),)  # kept by the store
    result = CliRunner().invoke(eff_command, ["400", "--json"], obj=app)
    assert result.exit_code == 0, result.output
    options = {n["kind"]: n["option"] for n in json.loads(result.output)["notes"]}
    assert options["slice"] == "--gres=gpu:1g.10gb:1"  # 1/7 of a GPU beats 2 of 4 shards


def test_eff_of_a_job_with_no_samples_asks_whether_the_agent_runs(
    db: tuple[str, AppContext],
) -> None:
    url, app = db
    store_job(url, make_job(job_id=300, cpus=4))
    result = CliRunner().invoke(eff_command, ["300"], obj=app)
    assert result.exit_code == 0, result.output
    assert "no usage samples: is `sgpu agent` running on gpu1?" in result.output


def test_eff_of_an_unknown_job_is_one_line_and_exit_1(db: tuple[str, AppContext]) -> None:
    _, app = db
    result = CliRunner().invoke(eff_command, ["999"], obj=app)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("sgpu: job 999 is not in the store")


def test_eff_of_an_unknown_array_task_is_exit_1(db: tuple[str, AppContext]) -> None:
    url, app = db
    _array_task_with_samples(url)
    result = CliRunner().invoke(eff_command, ["120_4"], obj=app)
    assert result.exit_code == 1
    assert result.stderr.startswith("sgpu: job 120_4 is not in the store")


def test_eff_refuses_a_malformed_job_id_with_exit_2(db: tuple[str, AppContext]) -> None:
    _, app = db
    result = CliRunner().invoke(eff_command, ["12x"], obj=app)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "sgpu: JOBID must look like 123 or 120_3 (array task), not '12x'"
    )


def test_json_of_a_pending_job_has_every_key_with_nulls() -> None:
    job = replace(make_job(state=JobState.PENDING), start_time=None, gpu_allocations=())
    report = job_efficiency(job, [], [], T0)
    data = to_json(report, notes(report))
    assert data["elapsed_s"] is None and data["time_use_pct"] is None
    assert data["gpu"] == {
        "allocated": 0,
        "sharing": "gpu",
        "equivalents": 1.0,  # what it asks for
        "busy": 0,
        "util_pct": None,
        "memory_max_mib": None,
        "memory_use_pct": None,
        "diagnosis": None,
    }
    assert data["notes"] == [
        {
            "kind": "not-started",
            "severity": "info",
            "text": "the job has not started: nothing to measure yet",
            "option": None,
        }
    ]


def test_the_store_reports_a_gpu_that_was_never_busy_as_never_busy(
    db: tuple[str, AppContext],
) -> None:
    url, _ = db
    store = open_store(url)
    samples = [
        GpuSampleIn(
            sample_uid=f"n-{minute}",
            at=(T0 + timedelta(minutes=minute)).timestamp(),
            gpu_index=2,
            job_id=55,
            util_pct=0.0,
            memory_used_mib=0.0,
            processes=0,
            source="idle",
        )
        for minute in range(11)
    ]
    usage = UsageStore(store.engine, store.cluster)
    usage.ingest(SampleBatch(node="gpu1", gpu=samples))
    (g,) = usage.gpu_usage(55)
    assert g.never_busy
    assert g.trailing_idle == timedelta(minutes=10)  # from the first sample, not from 1970
    assert g.max_processes == 0


def test_a_mig_slice_with_unknown_util_is_reported_unknown_not_idle(tmp_path: Path) -> None:
    """Util None (a MIG slice without GPM) is stored as NULL and read back as unknown."""
    store = open_store(f"sqlite:///{tmp_path / 'mig.db'}")
    usage = UsageStore(store.engine, store.cluster)
    at = T0.timestamp()
    usage.ingest(
        SampleBatch(
            node="gpu1",
            gpu=[
                GpuSampleIn(
                    sample_uid=f"m{i}",
                    at=at + 60 * i,
                    gpu_index=2,
                    job_id=100,
                    util_pct=None,
                    memory_used_mib=3000.0,
                    memory_total_mib=10240.0,
                    processes=1,
                    source="device",
                )
                for i in range(30)
            ],
        )
    )
    with store.engine.connect() as conn:
        utils = conn.exec_driver_sql("SELECT DISTINCT util_pct FROM samples").all()
    assert utils == [(None,)]  # NULL, never 0
    (u,) = usage.gpu_usage(100)
    assert (u.samples, u.mean_util_pct, u.max_util_pct, u.max_memory_mib) == (
        30,
        None,
        None,
        3000.0,
    )
    job = make_job(cpus=1, gpus={"gpu1": (2,)}, elapsed=timedelta(minutes=30))
    report = job_efficiency(job, [u], [host("gpu1", 90.0, 1)], ended(job))
    (g,) = report.gpus
    assert (g.status, g.trailing_idle, g.mean_util_pct) == ("util-unknown", None, None)
    assert report.gpu_util_pct is None
    assert not {"idle-gpu", "no-gpu-use", "gpus"} & set(kinds(notes(report)))
    assert "util-unknown" in _render_text(report)


def test_an_mps_job_whose_only_known_samples_precede_its_process_is_not_idle(
    tmp_path: Path,
) -> None:
    """Issue 39: an MPS client's only known util were the 0 % samples taken before its
    process started (NVML gives no client's share), so eff read it as idle. Now the GPU
    is util-unknown, the summary counts it neither used nor idle, and the energy of its
    unknown intervals is not idle energy."""
    from slurmgpu.store.summary_columns import summary_columns

    store = open_store(f"sqlite:///{tmp_path / 'mps.db'}")
    usage = UsageStore(store.engine, store.cluster)
    at = T0.timestamp()

    def sample(i: int, started: bool) -> GpuSampleIn:
        return GpuSampleIn(
            sample_uid=f"p{i}",
            at=at + 10 * i,
            gpu_index=1,
            job_id=100,
            util_pct=None if started else 0.0,
            memory_used_mib=6144.0 if started else 0.0,
            memory_total_mib=81920.0,
            power_w=200.0,
            energy_mj=1000 * 200 * 10 * i,
            processes=1 if started else 0,
            shared=True,
            source="process" if started else "idle",
        )

    usage.ingest(SampleBatch(node="gpu3", gpu=[sample(i, i >= 2) for i in range(30)]))
    (u,) = usage.gpu_usage(100)
    assert (u.samples, u.mean_util_pct, u.max_processes) == (30, None, 1)
    job = make_job(cpus=1, gpus={}, elapsed=timedelta(minutes=5))
    job = replace(
        job,
        gpus=GpuRequest(mps=50),
        nodes=("gpu3",),
        gpu_allocations=(NodeGpuAllocation("gpu3", mps_indices=(1,), mps=50),),
    )
    report = job_efficiency(job, [u], [host("gpu3", 90.0, 1)], ended(job))
    (g,) = report.gpus
    assert (g.status, g.mean_util_pct, g.trailing_idle) == ("util-unknown", None, None)
    assert report.gpu_util_pct is None
    assert not {"idle-gpu", "no-gpu-use"} & set(kinds(notes(report)))
    assert (report.sharing, report.gpu_equivalents) == ("mps", 0.5)
    text = _render_text(report)
    assert "util unknown" in text and "mps:50" in text
    assert "0.5 GPU-equivalents (MPS 50)" in text and "gpu3[m1]" in text
    (e,) = usage.gpu_energy(100)
    assert e.energy_j == pytest.approx(29 * 2000.0)  # 200 W over 290 s
    assert e.idle_energy_j == pytest.approx(2000.0)  # the one interval closing at 0 %
    summary = {
        "elapsed_s": 300,
        "gpus_requested": 0,
        "nodes": {"gpu3": {"gpus": {"1": {"util_pct_mean": None, "never_busy": True}}}},
    }
    figures = summary_columns(summary)
    assert (figures["gpu_util_pct"], figures["gpu_idle_pct"]) == (None, None)


def test_samples_of_unknown_util_at_the_end_are_no_idle_time(tmp_path: Path) -> None:
    # An MPS job busy alone (the device's util is its own) for 57 samples; then another
    # job's client joins and its last 3 samples' util is unknown: not 30 s of idleness.
    store = open_store(f"sqlite:///{tmp_path / 'tail.db'}")
    usage = UsageStore(store.engine, store.cluster)
    usage.ingest(
        SampleBatch(
            node="gpu3",
            gpu=[
                GpuSampleIn(
                    sample_uid=f"t{i}",
                    at=T0.timestamp() + 10 * i,
                    gpu_index=0,
                    job_id=8,
                    util_pct=None if i >= 57 else 60.0,
                    processes=1,
                    shared=True,
                    source="process",
                )
                for i in range(60)
            ],
        )
    )
    (u,) = usage.gpu_usage(8)
    assert u.mean_util_pct == pytest.approx(60.0)
    assert u.trailing_idle == timedelta(0) and not u.never_busy


def test_a_gpu_with_a_few_unknown_samples_keeps_its_known_mean(tmp_path: Path) -> None:
    # GPM's first reading of a MIG slice is unknown: one of 30 does not hide the rest.
    store = open_store(f"sqlite:///{tmp_path / 'mig.db'}")
    usage = UsageStore(store.engine, store.cluster)
    usage.ingest(
        SampleBatch(
            node="gpu2",
            gpu=[
                GpuSampleIn(
                    sample_uid=f"g{i}",
                    at=T0.timestamp() + 10 * i,
                    gpu_index=0,
                    job_id=7,
                    util_pct=None if i == 0 else 40.0,
                    processes=1,
                    source="device",
                )
                for i in range(30)
            ],
        )
    )
    (u,) = usage.gpu_usage(7)
    assert u.mean_util_pct == pytest.approx(40.0)


def _render_text(report: JobEfficiency) -> str:
    console = Console(width=120, record=True)
    console.print(render_report(report, notes(report)))
    return console.export_text()
