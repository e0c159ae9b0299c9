"""The simulated GPU probe and the fake load program, with real processes and real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmgpu.lab.fakeload import (
    FakeloadError,
    LoadPattern,
    LoadSchedule,
    devices_from_environ,
    parse_duration_s,
    parse_pattern,
    run_fakeload,
)
from slurmgpu.telemetry.probe import GpuDeviceSample, GpuProbe
from slurmgpu.telemetry.simgpu import (
    LoadDeclaration,
    SimulatedGpuProbe,
    declaration_path,
    read_declarations,
    write_declaration,
)
from slurmgpu.units import parse_size_mib
from tests.polling import wait_for

LAB_GRES_CONF = """\
# fake GPUs (any existing char device works)
AutoDetect=off
NodeName=gpu[1-4] Name=gpu File=/dev/tty[0-3]
NodeName=gpu[1-4] Name=shard Count=16
"""
DEADLINE_S = 30.0


@pytest.fixture
def gres_conf(tmp_path: Path) -> Path:
    path = tmp_path / "gres.conf"
    path.write_text(LAB_GRES_CONF)
    return path


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "simgpu"


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start real idle processes (live pids to declare for); they are killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _fakeload_env(devices: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_"))}
    env.update(CUDA_VISIBLE_DEVICES=devices, SLURM_JOB_ID="321", SLURMD_NODENAME="gpu1")
    return env


def start_fakeload(state_dir: Path, *args: str, devices: str = "0,1") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmgpu.cli.fakeload",
            "--state-dir",
            str(state_dir),
            "--interval",
            "0.2s",
            *args,
        ],
        env=_fakeload_env(devices),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _proc_on(sample: GpuDeviceSample, pid: int) -> tuple[float | None, int | None] | None:
    for p in sample.processes:
        if p.pid == pid:
            return p.sm_util_pct, p.used_memory_mib
    return None


# -- devices ----------------------------------------------------------------------------


def test_devices_follow_the_nodes_gres_conf(gres_conf: Path, state_dir: Path) -> None:
    probe = SimulatedGpuProbe("gpu3", gres_conf, None, state_dir, memory_total_mib=40960)
    assert isinstance(probe, GpuProbe)
    samples = probe.sample()
    assert [(s.index, s.minor_number) for s in samples] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert all(s.util_pct == 0 and s.memory_used_mib == 0 for s in samples)
    assert {s.memory_total_mib for s in samples} == {40960}
    assert len({s.uuid for s in samples}) == 4  # stable and distinct
    assert SimulatedGpuProbe("cpu1", gres_conf, None, state_dir).sample() == []


def test_device_count_is_used_without_a_gres_conf(state_dir: Path) -> None:
    samples = SimulatedGpuProbe("n1", None, 2, state_dir).sample()
    assert [(s.index, s.minor_number) for s in samples] == [(0, 0), (1, 1)]


def test_minor_numbers_come_from_the_device_file_names(tmp_path: Path, state_dir: Path) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text("Name=gpu Type=a100 File=/dev/nvidia[4-5]\nName=gpu File=/dev/nvidia1\n")
    samples = SimulatedGpuProbe("any", conf, None, state_dir).sample()
    assert [(s.index, s.minor_number) for s in samples] == [(0, 4), (1, 5), (2, 1)]
    assert samples[0].name == "Simulated a100"


# -- declarations read by the probe -----------------------------------------------------


def _declare(
    state_dir: Path, pid: int, device: int, util: float, mem: int, **kw: float
) -> LoadDeclaration:
    d = LoadDeclaration(
        pid=pid,
        device=device,
        util_pct=util,
        memory_mib=mem,
        job_id=7,
        updated_at=kw.get("updated_at", time.time()),
        interval_s=kw.get("interval_s", 5.0),
    )
    write_declaration(state_dir, "gpu1", d)
    return d


def test_processes_on_one_device_add_up_and_util_is_capped(
    gres_conf: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    a, b = sleeper(), sleeper()
    _declare(state_dir, a.pid, 0, 70.0, 4000)
    _declare(state_dir, b.pid, 0, 50.0, 8000)
    _declare(state_dir, b.pid, 2, 20.0, 1000)
    dev0, dev1, dev2, _ = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir).sample()
    assert (dev0.util_pct, dev0.memory_used_mib) == (100.0, 12000)
    assert sorted((p.pid, p.sm_util_pct, p.used_memory_mib) for p in dev0.processes) == sorted(
        [(a.pid, 70.0, 4000), (b.pid, 50.0, 8000)]
    )
    assert (dev1.util_pct, dev1.processes) == (0.0, ())
    assert (dev2.util_pct, dev2.memory_used_mib) == (20.0, 1000)


def test_dead_and_stale_declarations_are_dropped(
    gres_conf: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    live, stale, dead = sleeper(), sleeper(), sleeper()
    dead.kill()
    dead.wait()
    _declare(state_dir, live.pid, 1, 30.0, 100)
    _declare(state_dir, stale.pid, 1, 40.0, 100, updated_at=time.time() - 60, interval_s=5)
    _declare(state_dir, dead.pid, 1, 50.0, 100)
    probe = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir)
    dev1 = probe.sample()[1]
    assert [p.pid for p in dev1.processes] == [live.pid]
    assert dev1.util_pct == 30.0
    # the dead process's file is cleaned up; the stale one stays until its pid is gone
    assert not declaration_path(state_dir, "gpu1", dead.pid, 1).exists()
    assert declaration_path(state_dir, "gpu1", stale.pid, 1).exists()


def test_a_zombie_counts_as_dead(gres_conf: Path, state_dir: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # exited but not reaped yet: a zombie, which os.kill(pid, 0) still "finds"
        wait_for(
            "the child to exit",
            lambda: Path(f"/proc/{child.pid}/stat").read_text().split(")")[-1].split()[0] == "Z",
        )
        _declare(state_dir, child.pid, 0, 90.0, 100)
        assert SimulatedGpuProbe("gpu1", gres_conf, None, state_dir).sample()[0].processes == ()
    finally:
        child.wait()


def test_malformed_and_temporary_files_are_ignored(
    gres_conf: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    proc = sleeper()
    _declare(state_dir, proc.pid, 0, 10.0, 10)
    node = state_dir / "gpu1"
    (node / ".half-written.tmp").write_text('{"pid": 1, "dev')
    (node / "garbage.json").write_text("not json")
    (node / "wrong.json").write_text(json.dumps({"pid": "x", "device": 0}))
    (node / "bool.json").write_text(
        json.dumps({"pid": True, "device": 0, "util_pct": 1, "memory_mib": 1, "updated_at": 1})
    )
    assert [d.pid for _, d in read_declarations(state_dir, "gpu1")] == [proc.pid]
    sample = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir).sample()[0]
    assert sample.util_pct == 10.0


def test_writes_are_atomic_and_leave_no_temporary_files(state_dir: Path) -> None:
    d = _declare(state_dir, os.getpid(), 3, 12.5, 256)
    path = declaration_path(state_dir, "gpu1", os.getpid(), 3)
    assert LoadDeclaration.from_mapping(json.loads(path.read_text())) == d
    assert sorted(p.name for p in (state_dir / "gpu1").iterdir()) == [f"{os.getpid()}-3.json"]


# -- the load program in real processes -------------------------------------------------


def test_probe_sees_the_declared_load_on_both_devices_until_the_process_dies(
    gres_conf: Path, state_dir: Path
) -> None:
    probe = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir)
    load = start_fakeload(state_dir, "--util", "70", "--mem", "2GiB", "--pattern", "constant")
    try:

        def both_loaded() -> list[GpuDeviceSample] | None:
            samples = probe.sample()
            seen = [_proc_on(s, load.pid) for s in samples]
            return samples if seen[:2] == [(70.0, 2048)] * 2 else None

        samples = wait_for("the fakeload's declarations", both_loaded)
        assert [s.util_pct for s in samples] == [70.0, 70.0, 0.0, 0.0]
        assert [s.memory_used_mib for s in samples] == [2048, 2048, 0, 0]
        (_, decl), *_ = read_declarations(state_dir, "gpu1")
        assert decl.job_id == 321
    finally:
        _stop(load)  # SIGKILL: the program cannot clean up; the probe must
    wait_for(
        "the killed process to disappear from samples",
        lambda: all(not s.processes for s in probe.sample()),
    )
    assert read_declarations(state_dir, "gpu1") == []


def test_sigterm_removes_the_declarations_and_exits_143(gres_conf: Path, state_dir: Path) -> None:
    probe = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir)
    load = start_fakeload(state_dir, "--util", "40", "--mem", "512MiB", devices="3")
    try:
        wait_for("the declaration", lambda: _proc_on(probe.sample()[3], load.pid))
        load.send_signal(signal.SIGTERM)
        assert load.wait(timeout=DEADLINE_S) == 143
    finally:
        _stop(load)
    # removed by the program itself (the probe's energy counters stay)
    assert [p.name for p in (state_dir / "gpu1").iterdir()] in ([], [".energy.json"])


def test_idle_after_pattern_drops_util_to_zero_and_keeps_memory(
    gres_conf: Path, state_dir: Path
) -> None:
    probe = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir)
    load = start_fakeload(
        state_dir, "--util", "55", "--mem", "1GiB", "--pattern", "idle-after:1s", devices="1"
    )
    try:
        wait_for("busy", lambda: _proc_on(probe.sample()[1], load.pid) == (55.0, 1024))
        wait_for("idle", lambda: _proc_on(probe.sample()[1], load.pid) == (0.0, 1024))
        assert probe.sample()[1].util_pct == 0.0
    finally:
        _stop(load)


# slow tier: waits on a real fakeload process growing its memory for 3 s
@pytest.mark.slow
def test_mem_growth_pattern_grows_memory_up_to_the_cap(gres_conf: Path, state_dir: Path) -> None:
    probe = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir)
    load = start_fakeload(
        state_dir,
        "--util",
        "20",
        "--mem",
        "1GiB",
        "--mem-max",
        "4GiB",
        "--pattern",
        "mem-growth:3s",
        devices="2",
    )
    readings: list[int] = []

    def at_cap() -> bool:
        seen = _proc_on(probe.sample()[2], load.pid)
        if seen is not None and seen[1] is not None and (not readings or readings[-1] != seen[1]):
            readings.append(seen[1])
        return bool(readings) and readings[-1] == 4096

    try:
        wait_for("memory to reach the cap", at_cap)
    finally:
        _stop(load)
    assert readings == sorted(readings)
    assert readings[0] < 4096 and len(readings) >= 2


def test_fakeload_without_devices_fails_with_one_line(state_dir: Path) -> None:
    env = _fakeload_env("")
    result = subprocess.run(
        [sys.executable, "-m", "slurmgpu.cli.fakeload", "--state-dir", str(state_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("sgpu: no GPU to load")
    assert result.stderr.count("\n") == 1


def test_run_fakeload_completes_its_duration_and_cleans_up(state_dir: Path) -> None:
    outcome = run_fakeload(30.0, 64, "constant", 0.3, state_dir, "gpu4", 0.1, devices=[0], job_id=9)
    assert outcome == "completed"
    assert read_declarations(state_dir, "gpu4") == []


# -- the load program's pure parts ------------------------------------------------------


def test_sizes_and_durations_parse() -> None:
    assert [parse_size_mib(s) for s in ("10GiB", "512MiB", "8G", "8gb", "1.5T", "100")] == [
        10240,
        512,
        8192,
        8192,
        1572864,
        100,
    ]
    assert parse_size_mib("1048576B") == 1
    for bad in ("", "ten", "10Q", "-1G", "GiB"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size_mib(bad)
    assert parse_duration_s("60s") == 60.0
    assert parse_duration_s("1h30m") == 5400.0
    assert parse_duration_s("inf") is None


def test_patterns_parse() -> None:
    assert parse_pattern("constant") == LoadPattern("constant")
    assert parse_pattern("idle-after:60s") == LoadPattern("idle-after", after_s=60.0)
    assert parse_pattern("bursty:20s") == LoadPattern("bursty", period_s=20.0)
    assert parse_pattern("mem-growth:5m") == LoadPattern("mem-growth", ramp_s=300.0)
    for bad in ("spiky", "idle-after", "idle-after:soon", "bursty:0s", "constant:1s"):
        with pytest.raises(ValueError, match="pattern"):
            parse_pattern(bad)


def test_idle_after_schedule() -> None:
    s = LoadSchedule(parse_pattern("idle-after:60s"), 80, 1000)
    assert [s.at(t) for t in (0, 59.9, 60, 600)] == [(80, 1000), (80, 1000), (0, 1000), (0, 1000)]


def test_bursty_schedule_alternates_and_is_reproducible_with_its_seed() -> None:
    def trace(seed: int) -> list[float]:
        s = LoadSchedule(parse_pattern("bursty:10s"), 90, 100, seed=seed)
        return [s.at(t / 2)[0] for t in range(400)]

    assert trace(1) == trace(1)
    assert trace(1) != trace(2)
    assert set(trace(1)) == {0.0, 90.0}
    assert trace(1)[0] == 90.0  # busy first


def test_mem_growth_schedule_is_linear_up_to_the_cap() -> None:
    s = LoadSchedule(parse_pattern("mem-growth:10s"), 50, 1000, mem_max_mib=2000)
    assert [s.at(t)[1] for t in (0, 5, 10, 20)] == [1000, 1500, 2000, 2000]
    with pytest.raises(FakeloadError, match="--mem-max"):
        LoadSchedule(parse_pattern("mem-growth"), 50, 1000)


@pytest.mark.parametrize(
    ("env", "devices"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, (0, 1)),
        # without ConstrainDevices CUDA_VISIBLE_DEVICES holds the global indices
        ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "2,3"}, (2, 3)),
        # ConstrainDevices renumbers from 0: read them as positions in SLURM_STEP_GPUS
        ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "3,2"}, (2, 3)),
        ({"SLURM_JOB_GPUS": "1"}, (1,)),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1234"}, ()),
        ({}, ()),
    ],
)
def test_devices_come_from_what_slurm_set(env: dict[str, str], devices: tuple[int, ...]) -> None:
    assert devices_from_environ(env) == devices


def test_run_fakeload_refuses_to_run_without_devices(state_dir: Path) -> None:
    with pytest.raises(FakeloadError, match="no GPU to load"):
        run_fakeload(50, 10, "constant", 1.0, state_dir, "gpu1", 1.0, environ={})


# -- power and the energy counter --------------------------------------------------------


def test_power_follows_the_gpu_models_idle_and_busy_draw(
    tmp_path: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    from slurmgpu.telemetry.gpupower import GPU_POWER

    conf = tmp_path / "typed.conf"
    conf.write_text("NodeName=gpu1 Name=gpu Type=v100 File=/dev/tty[0-1]\n")
    proc = sleeper()
    _declare(state_dir, proc.pid, 1, 100.0, 100)
    idle, busy = SimulatedGpuProbe("gpu1", conf, None, state_dir).sample()
    v100 = GPU_POWER["v100"]
    assert (idle.power_w, busy.power_w) == (v100.idle_w, v100.busy_w)
    assert busy.name == "Simulated v100"
    # no gres type: the model passed in (here an H200: 81 W idle, as measured)
    h200 = SimulatedGpuProbe("n1", None, 1, state_dir, gpu_model="h200").sample()[0]
    assert h200.power_w == 81.0


def test_energy_counter_integrates_power_and_survives_a_new_probe(
    gres_conf: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    clock = [1_700_000_000.0]
    proc = sleeper()
    probe = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir, clock=lambda: clock[0])
    first = probe.sample()[0]
    assert first.energy_mj == 0
    _declare(state_dir, proc.pid, 0, 50.0, 100, updated_at=clock[0] + 10, interval_s=60)
    clock[0] += 10  # 10 s at the power of the reading that ends them (50 % busy)
    second = probe.sample()[0]
    assert first.power_w is not None and second.power_w is not None
    assert second.power_w > first.power_w
    assert second.energy_mj == round(second.power_w * 10 * 1000)
    # a new probe (agent restart) continues the counter: it never goes back
    clock[0] += 5
    third = SimulatedGpuProbe("gpu1", gres_conf, None, state_dir, clock=lambda: clock[0])
    reading = third.sample()[0]
    assert reading.power_w == second.power_w  # the declaration is still live
    assert reading.energy_mj == second.energy_mj + round(second.power_w * 5 * 1000)
    assert sorted(p.name for p in (state_dir / "gpu1").iterdir())[0] == ".energy.json"


MIG_GRES_CONF = """\
AutoDetect=off
# GPU 0 split in MIG instances (first file: the parent), GPU 1 whole and shared by MPS.
NodeName=gpu1 Name=gpu Type=3g.40gb MultipleFiles=/dev/tty0,/dev/tty10
NodeName=gpu1 Name=gpu Type=1g.10gb MultipleFiles=/dev/tty0,/dev/tty11
NodeName=gpu1 Name=gpu Type=1g.10gb MultipleFiles=/dev/tty0,/dev/tty12
NodeName=gpu1 Name=gpu Type=h100 File=/dev/tty1
NodeName=gpu1 Name=mps Count=100 File=/dev/tty1
"""


def test_mig_lines_of_one_gpu_are_one_device_with_an_instance_each(
    tmp_path: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text(MIG_GRES_CONF)
    a, b = sleeper(), sleeper()
    _declare(state_dir, a.pid, 0, 60.0, 30000)  # Slurm index 0: the 3g.40gb instance
    _declare(state_dir, b.pid, 2, 25.0, 2000)  # Slurm index 2: the second 1g.10gb
    probe = SimulatedGpuProbe("gpu1", conf, None, state_dir)
    assert isinstance(probe, GpuProbe)
    mig, whole = probe.sample()
    assert (mig.index, mig.minor_number, whole.index, whole.minor_number) == (0, 0, 3, 1)
    assert mig.util_pct is None  # as NVML on a MIG-enabled board: unknown, not 0
    assert mig.memory_used_mib == 32000
    assert [
        (m.index, m.gpu_instance_id, m.profile, m.memory_total_mib, m.memory_used_mib, m.util_pct)
        for m in mig.mig_instances
    ] == [
        (0, 1, "3g.40gb", 40960, 30000, 60.0),
        (1, 2, "1g.10gb", 10240, 0, 0.0),
        (2, 3, "1g.10gb", 10240, 2000, 25.0),
    ]
    assert [(p.pid, p.used_memory_mib, p.sm_util_pct) for p in mig.mig_instances[0].processes] == [
        (a.pid, 30000, None)
    ]
    assert len({m.uuid for m in mig.mig_instances}) == 3
    assert all((m.uuid or "").startswith("MIG-") for m in mig.mig_instances)
    # Power: 60 % of 3 of 7 slices plus 25 % of 1 busier than idle, below full load.
    model = probe.power_models[0]
    assert model.power_w(0.0) < (mig.power_w or 0.0) < model.power_w(100.0)


def test_mps_clients_have_memory_but_no_per_process_share(
    tmp_path: Path, state_dir: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text(MIG_GRES_CONF)
    a, b = sleeper(), sleeper()
    _declare(state_dir, a.pid, 3, 30.0, 1000)
    _declare(state_dir, b.pid, 3, 20.0, 3000)
    _, whole = SimulatedGpuProbe("gpu1", conf, None, state_dir).sample()
    assert whole.util_pct == 50.0 and whole.mig_instances == ()
    assert sorted((p.pid, p.used_memory_mib, p.sm_util_pct) for p in whole.processes) == sorted(
        [(a.pid, 1000, None), (b.pid, 3000, None)]
    )
