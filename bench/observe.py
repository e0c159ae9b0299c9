"""Benchmark one observe cycle at scale: 10,000 nodes and 100,000 jobs.

Generates synthetic ``squeue --json`` / ``sinfo --json`` documents in Slurm 22.05's
format (every field Slurm 22.05 prints, pretty-printed like squeue does, so the bytes are
realistic: about 3.5 KB a job), then measures in separate processes, so one's memory
does not inflate the other's peak RSS:

- baseline: a bare ``json.loads`` of the same squeue bytes;
- slurmgpu: parse + normalise (``decode_squeue``), and full cycles (parse + normalise +
  diff + store into SQLite), cold (empty database) and incremental (1 % of jobs changed).

Targets (issue 2): incremental cycle <= 2 s; parse + normalise <= 3x json.loads; peak
RSS < 1 GiB. Run: ``.venv/bin/python bench/observe.py [--jobs 100000 --nodes 10000]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurmgpu.lab.benchrun import BenchRun, add_arguments

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "slurm-22.05"
T_NOW = 1796217365


def _templates() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    squeue = json.loads((GOLDEN / "squeue.json").read_text())
    sinfo = json.loads((GOLDEN / "sinfo.json").read_text())
    job = next(j for j in squeue["jobs"] if j["job_state"] == "RUNNING")
    return squeue, job, sinfo


def make_documents(n_jobs: int, n_nodes: int, seed: int = 1) -> tuple[bytes, bytes, bytes]:
    """Return (squeue cold, squeue with 1 % of jobs changed, sinfo) as bytes."""
    rng = random.Random(seed)
    squeue, job_t, sinfo = _templates()
    node_t = sinfo["nodes"][0]
    users = [f"user{i:03d}" for i in range(500)]
    parts = ["gpu", "gpu-long", "debug", "a100"]
    node_names = [f"gpu{i:05d}" for i in range(1, n_nodes + 1)]
    jobs: list[dict[str, Any]] = []
    for i in range(n_jobs):
        j = copy.deepcopy(job_t)
        jid = 1000 + i
        u = rng.choice(users)
        j.update(
            job_id=jid,
            name=f"train-{rng.randrange(5000)}",
            user_name=u,
            user_id=10000 + users.index(u),
            account=f"acct{rng.randrange(40)}",
            partition=rng.choice(parts),
            submit_time=T_NOW - rng.randrange(86400),
            time_limit=rng.choice([60, 240, 1440, 2880, None]),
            comment="",
        )
        gpus = rng.choice([1, 1, 1, 2, 4, 8])
        j["tres_per_node"] = f"gres:gpu:{min(gpus, 4)}"
        running = rng.random() < 0.3
        if running:
            nodes = rng.sample(node_names, 1 if gpus <= 4 else 2)
            j.update(
                job_state="RUNNING",
                state_reason="None",
                nodes=",".join(nodes),
                start_time=T_NOW - rng.randrange(3600),
                batch_host=nodes[0],
            )
            j["gres_detail"] = [f"gpu:{min(gpus, 4)}(IDX:0-{min(gpus, 4) - 1})" for _ in nodes]
            j["node_count"] = len(nodes)
        else:
            j.update(
                job_state="PENDING",
                state_reason=rng.choice(["Priority", "Resources"]),
                nodes="",
                start_time=0,
                end_time=0,
                batch_host="",
                gres_detail=[],
            )
            j["job_resources"] = {}
        jobs.append(j)
    cold = dict(squeue, jobs=jobs)
    cold_bytes = json.dumps(cold, indent=2).encode()
    # 1 % of jobs change: pending ones start, running ones complete.
    changed = rng.sample(range(n_jobs), max(1, n_jobs // 100))
    for idx in changed:
        j = jobs[idx]
        if j["job_state"] == "PENDING":
            node = rng.choice(node_names)
            j.update(
                job_state="RUNNING",
                state_reason="None",
                nodes=node,
                start_time=T_NOW,
                batch_host=node,
                gres_detail=["gpu:1(IDX:0)"],
                node_count=1,
            )
        else:
            j.update(job_state="COMPLETED", end_time=T_NOW + 30)
    warm_bytes = json.dumps(dict(squeue, jobs=jobs), indent=2).encode()
    nodes_out = []
    for name in node_names:
        n = copy.deepcopy(node_t)
        n.update(
            name=name, hostname=name, address=name, state=rng.choice(["idle", "mixed", "allocated"])
        )
        nodes_out.append(n)
    sinfo_bytes = json.dumps(dict(sinfo, nodes=nodes_out), indent=2).encode()
    return cold_bytes, warm_bytes, sinfo_bytes


def _peak_rss_mib() -> float:
    """Peak resident memory of this process (VmHWM; ru_maxrss carries the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_baseline(squeue_path: Path, repeats: int) -> dict[str, float]:
    data = squeue_path.read_bytes()
    times, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        doc = json.loads(data)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        del doc
    return {
        "json_loads_s": statistics.median(times),
        "json_loads_cpu_s": statistics.median(cpu),
        "peak_rss_mib": _peak_rss_mib(),
    }


def child_pipeline(cold: Path, warm: Path, sinfo: Path, repeats: int) -> dict[str, float]:
    from datetime import UTC, datetime, timedelta

    from slurmgpu.daemon.observer import Observer
    from slurmgpu.slurm.cli import decode_squeue
    from slurmgpu.slurm.replay import ReplaySlurmClient
    from slurmgpu.store import open_store

    warm_bytes = warm.read_bytes()
    parse_times, parse_cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        jobs, _version = decode_squeue(warm_bytes)
        parse_times.append(time.perf_counter() - t)
        parse_cpu.append(time.process_time() - c)
        del jobs
    out: dict[str, float] = {
        "parse_normalise_s": statistics.median(parse_times),
        "parse_normalise_cpu_s": statistics.median(parse_cpu),
    }
    del warm_bytes
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/state.db")
        slurm = ReplaySlurmClient(cold, sinfo)
        at = datetime(2026, 12, 1, tzinfo=UTC)
        observer = Observer(slurm, store, clock=lambda: at)
        r = observer.cycle()
        assert r.ok, r.error
        out["cold_cycle_s"] = r.seconds
        out["cold_store_s"] = r.timings["store"]
        # Alternate warm and cold documents: each cycle then sees the same 1 % of jobs change.
        docs = [warm, cold]
        incremental, incremental_cpu = [], []
        for k in range(max(repeats, 3)):
            slurm.squeue = docs[k % 2]
            at = at + timedelta(seconds=30)
            c = time.process_time()
            r = observer.cycle()
            incremental_cpu.append(time.process_time() - c)
            assert r.ok, r.error
            incremental.append(r)
        mid = sorted(incremental, key=lambda x: x.seconds)[len(incremental) // 2]
        # CPU time of the cycle (this process): what a loaded machine inflates least.
        out["incremental_cycle_cpu_s"] = statistics.median(incremental_cpu)
        out["incremental_changed"] = mid.changed
        out["incremental_cycle_s"] = mid.seconds
        out["incremental_diff_s"] = mid.timings["diff"]
        out["incremental_store_s"] = mid.timings["store"]
        out["incremental_fetch_s"] = mid.timings["jobs"] + mid.timings["nodes"]
        out["jobs_stored"] = store.count_jobs()
    out["peak_rss_mib"] = _peak_rss_mib()
    return out


def _run_child(*args: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench child failed:\n{proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=["baseline", "pipeline"], help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    add_arguments(ap, "2,000 jobs on 200 nodes, one repeat")
    a = ap.parse_args()
    if a.smoke:
        a.jobs, a.nodes, a.repeats = 2_000, 200, 1
    if a.child == "baseline":
        print(json.dumps(child_baseline(Path(a.paths[0]), a.repeats)))
        return
    if a.child == "pipeline":
        cold_path, warm_path, sinfo_path = (Path(p) for p in a.paths)
        print(json.dumps(child_pipeline(cold_path, warm_path, sinfo_path, a.repeats)))
        return
    t = time.perf_counter()
    cold, warm, sinfo = make_documents(a.jobs, a.nodes)
    print(
        f"generated {a.jobs:,} jobs ({len(warm) / 2**20:.0f} MiB squeue JSON) and "
        f"{a.nodes:,} nodes ({len(sinfo) / 2**20:.0f} MiB sinfo JSON) "
        f"in {time.perf_counter() - t:.1f}s",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / n for n in ("squeue-cold.json", "squeue-warm.json", "sinfo.json")]
        for p, data in zip(paths, (cold, warm, sinfo), strict=True):
            p.write_bytes(data)
        del cold, warm, sinfo
        base = _run_child("--child", "baseline", "--repeats", str(a.repeats), str(paths[1]))
        ours = _run_child("--child", "pipeline", "--repeats", str(a.repeats), *map(str, paths))
    ratio = ours["parse_normalise_s"] / base["json_loads_s"]
    run = BenchRun.from_args("observe", a)
    del run.params["paths"], run.params["child"]
    run.baseline = base
    run.figures = ours
    run.target("parse_vs_json_loads", ratio, "<= 3", ratio <= 3)
    inc = ours["incremental_cycle_s"]
    run.target("incremental_cycle_s", inc, "<= 2", inc <= 2)
    rss = ours["peak_rss_mib"]
    run.target("peak_rss_mib", rss, "< 1024", rss < 1024)
    rows = [
        ("baseline json.loads (median)", f"{base['json_loads_s']:.2f} s", ""),
        (
            "parse + normalise (median)",
            f"{ours['parse_normalise_s']:.2f} s",
            f"{ratio:.2f}x json.loads (target <= 3x) {'OK' if ratio <= 3 else 'MISSED'}; "
            f"CPU {ours['parse_normalise_cpu_s']:.2f} s vs {base['json_loads_cpu_s']:.2f} s",
        ),
        (
            "cold cycle (empty database)",
            f"{ours['cold_cycle_s']:.2f} s",
            f"store {ours['cold_store_s']:.2f} s, {int(ours['jobs_stored']):,} jobs stored",
        ),
        (
            "incremental cycle (1% changed)",
            f"{ours['incremental_cycle_s']:.2f} s",
            f"fetch+parse {ours['incremental_fetch_s']:.2f} s, "
            f"diff {ours['incremental_diff_s']:.2f} s, "
            f"store {ours['incremental_store_s']:.2f} s, "
            f"{int(ours['incremental_changed']):,} changed, "
            f"CPU {ours['incremental_cycle_cpu_s']:.2f} s "
            f"(target <= 2 s) {'OK' if ours['incremental_cycle_s'] <= 2 else 'MISSED'}",
        ),
        (
            "peak RSS, slurmgpu process",
            f"{ours['peak_rss_mib']:.0f} MiB",
            f"(target < 1024 MiB) {'OK' if ours['peak_rss_mib'] < 1024 else 'MISSED'}; "
            f"json.loads process: {base['peak_rss_mib']:.0f} MiB",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>9}  {note}")
    run.write(a.json_out)


if __name__ == "__main__":
    main()
