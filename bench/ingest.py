"""Benchmark the daemon's sample ingest against a bare sqlite3 executemany.

Three figures, measured in the same run on the same rows (SQLite in WAL mode, the
samples table with its unique key and indexes, as slurmgpu creates it):

- baseline: ``sqlite3`` ``executemany`` of plain INSERTs, one transaction per batch;
- service: what the daemon does per POST minus the socket: HMAC check, schema
  validation (msgspec), idempotent insert (ON CONFLICT DO NOTHING) through SQLAlchemy;
- HTTP: the same batches POSTed to a real API server on 127.0.0.1 by client processes
  (separate processes, so the clients' work does not share the server's interpreter).

Targets (issue 3): >= 20,000 samples/s, and >= 0.5x the baseline rate.
Run: ``.venv/bin/python bench/ingest.py [--batches 200 --per-batch 500 --repeats 3]``.
"""

from __future__ import annotations

import argparse
import http.client
import sqlite3
import statistics
import tempfile
import time
import urllib.parse
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.daemon.placement import SnapshotPlacement
from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.model import ClusterSnapshot, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch, encode, hmac_header, node_token

SECRET = b"b" * 64


def make_batches(n_batches: int, per_batch: int, tag: str) -> list[SampleBatch]:
    t0 = time.time() - 86400
    out = []
    for b in range(n_batches):
        node = f"gpu{b % 64:03d}"
        gpu = [
            GpuSampleIn(
                # Shaped as agents make them (agent.sampler.sample_uid: node first), so the
                # daemon stores them as sent, like the baseline; a foreign-shaped id would
                # be hashed per node (store.sample_ingest.node_scoped_uid), a path agents
                # never take.
                sample_uid=f"{node}:{tag}:{b}:{i}",
                at=t0 + b * 10 + i * 0.001,
                gpu_index=i % 8,
                job_id=1000 + (i % 8) + 8 * (b % 64),
                util_pct=float((i * 37) % 100),
                memory_used_mib=float(1000 + i),
                memory_total_mib=81920.0,
                power_w=250.0,
                temperature_c=60.0,
                processes=1,
                source="device",
            )
            for i in range(per_batch)
        ]
        out.append(SampleBatch(node=node, gpu=gpu))
    return out


def baseline_rate(path: Path, batches: list[SampleBatch]) -> float:
    """Samples/s for a bare sqlite3 executemany into a samples table created by slurmgpu."""
    open_store(f"sqlite:///{path}")  # same schema and indexes
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    cols = (
        "sample_uid, cluster, node, kind, job_id, gpu_index, at, util_pct, memory_used_mib, "
        "memory_total_mib, power_w, temperature_c, processes, shared, source"
    )
    sql = f"INSERT INTO samples ({cols}) VALUES ({', '.join('?' * 15)})"
    rows = [
        [
            (
                s.sample_uid,
                "",
                b.node,
                "gpu",
                s.job_id,
                s.gpu_index,
                datetime.fromtimestamp(s.at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
                s.util_pct,
                s.memory_used_mib,
                s.memory_total_mib,
                s.power_w,
                s.temperature_c,
                s.processes,
                s.shared,
                s.source,
            )
            for s in b.gpu
        ]
        for b in batches
    ]
    t = time.perf_counter()
    for batch_rows in rows:
        with conn:
            conn.executemany(sql, batch_rows)
    elapsed = time.perf_counter() - t
    conn.close()
    return sum(len(r) for r in rows) / elapsed


def _running_jobs(start: float) -> tuple[Job, ...]:
    """The jobs make_batches reports: 8 one-GPU jobs on each of the 64 nodes."""
    return tuple(
        Job(
            job_id=1000 + k + 8 * n,
            name="bench",
            user="u",
            state=JobState.RUNNING,
            start_time=datetime.fromtimestamp(start, UTC),
            nodes=(f"gpu{n:03d}",),
            node_count=1,
            gpu_allocations=(NodeGpuAllocation(f"gpu{n:03d}", (k,)),),
        )
        for n in range(64)
        for k in range(8)
    )


def _service(path: Path, checked: bool = False) -> IngestService:
    """The API's request logic; ``checked``: with the daemon's placement lookup, every
    sample checked against its job's node, GPU and run (what ``sgpu daemon`` does)."""
    store = open_store(f"sqlite:///{path}")
    nodes = tuple(Node(f"gpu{i:03d}", "mixed", gpus=8, address="127.0.0.1") for i in range(64))
    jobs = _running_jobs(time.time() - 2 * 86400) if checked else ()
    snap = ClusterSnapshot(taken_at=datetime.now(UTC), jobs=jobs, nodes=nodes)
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(site_secret=SECRET, allow_munge=False, node_addresses=directory.addresses)
    usage = UsageStore(store.engine)
    if checked:
        usage.placement = SnapshotPlacement(lambda: snap, store.engine)
    return IngestService(usage, auth, directory)


def _signed(batches: list[SampleBatch]) -> list[tuple[bytes, str]]:
    out = []
    for b in batches:
        body = encode(b)
        out.append((body, hmac_header(node_token(SECRET, b.node), b.node, body)))
    return out


def service_rate(path: Path, batches: list[SampleBatch], checked: bool = False) -> float:
    service = _service(path, checked)
    requests = _signed(batches)
    t = time.perf_counter()
    for body, header in requests:
        status, reply = service.post_samples("127.0.0.1", header, body)
        assert status == 200, reply
    elapsed = time.perf_counter() - t
    if checked:  # every sample fitted its job: stored, none held or refused
        assert service.usage.count_samples() == sum(len(b.gpu) for b in batches)
    return sum(len(b.gpu) for b in batches) / elapsed


def _post_all(url: str, part: list[tuple[bytes, str]], start_at: float) -> int:
    """Client process: wait for the common start, POST every request, return failures."""
    while time.time() < start_at:
        time.sleep(0.001)
    failures = 0
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    for body, header in part:
        headers = {"Authorization": header, "Content-Type": "application/json"}
        try:  # one kept-alive connection per client, as an agent keeps one
            conn.request("POST", parts.path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            failures += resp.status != 200
        except OSError:
            failures += 1
            conn.close()
    conn.close()
    return failures


def http_rate(path: Path, batches: list[SampleBatch], clients: int = 2) -> float:
    service = _service(path)
    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    url = f"http://127.0.0.1:{server.address[1]}/v1/samples"
    requests = _signed(batches)
    with ProcessPoolExecutor(clients) as pool:
        start_at = time.time() + 1.0
        futures = [
            pool.submit(_post_all, url, requests[i::clients], start_at) for i in range(clients)
        ]
        failures = sum(f.result() for f in futures)
    elapsed = time.time() - start_at
    server.stop()
    if failures:
        raise SystemExit(f"{failures} HTTP requests failed")
    stored = service.usage.count_samples()
    assert stored == sum(len(b.gpu) for b in batches), stored
    return stored / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--checked",
        action="store_true",
        help="also time the service with the daemon's placement checks (node, GPU, run)",
    )
    add_arguments(ap, "6 batches of 200, one run")
    a = ap.parse_args()
    if a.smoke:
        a.batches, a.per_batch, a.repeats = 6, 200, 1
    run = BenchRun.from_args("ingest", a)
    base, svc, http, checked = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            batches = make_batches(a.batches, a.per_batch, f"r{r}")
            base.append(baseline_rate(Path(tmp) / f"base{r}.db", batches))
            svc.append(service_rate(Path(tmp) / f"svc{r}.db", batches))
            if a.checked:
                checked.append(service_rate(Path(tmp) / f"chk{r}.db", batches, checked=True))
            http.append(http_rate(Path(tmp) / f"http{r}.db", batches))
    n = a.batches * a.per_batch
    b, s, h = statistics.median(base), statistics.median(svc), statistics.median(http)
    print(f"{n:,} samples in {a.batches} batches of {a.per_batch}, median of {a.repeats} runs")
    print(f"baseline sqlite3 executemany   {b:>10,.0f} samples/s")
    run.baseline = {"executemany_samples_per_s": b, "runs": base}
    run.figures = {
        "service_samples_per_s": s,
        "http_samples_per_s": h,
        "service": svc,
        "http": http,
    }
    if checked:
        c = statistics.median(checked)
        run.figures["checked_samples_per_s"] = c
        run.figures["checked"] = checked
        print(f"daemon ingest (service, checked) {c:>8,.0f} samples/s  {c / b:.2f}x baseline")
    run.target("service_rate", s, ">= 20000", s >= 20_000)
    run.target("service_vs_baseline", s / b, ">= 0.5", s / b >= 0.5)
    run.target("http_rate", h, ">= 20000", h >= 20_000)
    run.target("http_vs_baseline", h / b, ">= 0.5", h / b >= 0.5)
    ok = "OK" if s >= 20_000 and s / b >= 0.5 else "MISSED"
    print(
        f"daemon ingest (service)        {s:>10,.0f} samples/s  {s / b:.2f}x baseline  "
        f"(target >= 20,000/s and >= 0.5x) {ok}"
    )
    ok = "OK" if h >= 20_000 and h / b >= 0.5 else "MISSED"
    print(
        f"daemon ingest (HTTP, 2 clients) {h:>9,.0f} samples/s  {h / b:.2f}x baseline  "
        f"(target >= 20,000/s and >= 0.5x) {ok}"
    )
    run.write(a.json_out)


if __name__ == "__main__":
    main()
