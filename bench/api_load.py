"""Load test of the ingest API under hostile peers, on 127.0.0.1 only; stops by itself.

One API server (slurmgpu.daemon.api, default ApiLimits) on a loopback port of its own
(port 0). For ``--seconds``, in two phases measured in the same run:

- baseline: ``--agents`` authenticated agents, each POSTing a signed batch of
  ``--per-batch`` samples every ``--every`` seconds, one connection per request, as
  ``sgpu agent`` does (a 503 is retried after its Retry-After, at most 5 times);
- under attack: the same agents while, in another process, ``--slow`` clients trickle
  request headers a byte at a time (slowloris), ``--oversized`` unauthenticated clients
  send 8 MiB POSTs again and again, and ``--idle`` clients open connections and send
  nothing, all from 127.0.0.2 (another host; agents come from 127.0.0.1). Every attacker
  stops when the phase ends.

Printed and recorded: agent batches stored / sent, agent request latency (median, p99),
503s the agents met, the server's threads and resident memory at their peak, and what
the server refused (401s, 503s, timeouts). Target: every agent batch is stored under
attack, threads stay within the connection limit, memory grows less than one 8 MiB body
per attacker would make it grow.

Run: ``.venv/bin/python bench/api_load.py [--seconds 20]`` (``--smoke``: 3 s).
"""

from __future__ import annotations

import argparse
import http.client
import logging
import multiprocessing
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from slurmgpu.daemon.api import ApiServer, Authenticator, IngestService, NodeDirectory
from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.model import ClusterSnapshot, Node
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import MAX_BODY_BYTES, GpuSampleIn, SampleBatch, encode, hmac_header, node_token

SECRET = b"L" * 64
NODES = 64
ATTACKER = ("127.0.0.2", 0)  # another loopback address: the attackers are another host


def _batch(node: str, seq: int, per_batch: int) -> bytes:
    now = time.time()
    return encode(
        SampleBatch(
            node=node,
            gpu=[
                GpuSampleIn(
                    sample_uid=f"{node}:{seq}:{i}",
                    at=now - i * 0.001,
                    gpu_index=i % 8,
                    job_id=1000 + i % 8,
                    util_pct=50.0,
                    memory_used_mib=1000.0,
                    memory_total_mib=81920.0,
                    source="device",
                )
                for i in range(per_batch)
            ],
        )
    )


@dataclass
class AgentFigures:
    sent: int = 0
    stored: int = 0
    retries_503: int = 0
    failures: int = 0
    latencies: list[float] = field(default_factory=list)


def _agent(
    port: int, node: str, until: float, every: float, per_batch: int, out: AgentFigures
) -> None:
    seq = 0
    while time.monotonic() < until:
        seq += 1
        body = _batch(node, seq, per_batch)
        out.sent += 1
        for _ in range(6):
            header = hmac_header(node_token(SECRET, node), node, body)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            t = time.perf_counter()
            try:
                conn.request("POST", "/v1/samples", body=body, headers={"Authorization": header})
                resp = conn.getresponse()
                resp.read()
                status, retry_after = resp.status, float(resp.getheader("Retry-After") or 1)
            except OSError:
                status, retry_after = 0, 1.0
            finally:
                conn.close()
            out.latencies.append(time.perf_counter() - t)
            if status == 200:
                out.stored += 1
                break
            if status == 503:
                out.retries_503 += 1
            time.sleep(min(retry_after, 5.0))
        else:
            out.failures += 1
        time.sleep(every)


def _slow_client(port: int, until: float) -> None:
    """Slowloris: request headers a byte at a time, a new connection when cut off."""
    line = b"POST /v1/samples HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100_000
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), 5, ATTACKER) as s:
                for b in line:
                    if time.monotonic() >= until:
                        return
                    s.sendall(bytes([b]))
                    time.sleep(0.5)
        except OSError:
            time.sleep(0.2)


def _oversized_client(port: int, until: float) -> None:
    """8 MiB unauthenticated POSTs, body streamed, again and again."""
    chunk = b"x" * 65536
    head = f"POST /v1/samples HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n"
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), 5, ATTACKER) as s:
                s.sendall(head.encode())
                for _ in range(MAX_BODY_BYTES // len(chunk)):
                    if time.monotonic() >= until:
                        return
                    s.sendall(chunk)
                s.recv(4096)
        except OSError:
            time.sleep(0.05)


def _idle_client(port: int, until: float) -> None:
    """Connect and say nothing; reconnect when the server hangs up."""
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), 5, ATTACKER) as s:
                s.settimeout(max(0.1, until - time.monotonic()))
                s.recv(1)
        except OSError:
            time.sleep(0.05)


def _attackers(port: int, seconds: float, slow: int, oversized: int, idle: int) -> None:
    """Child process: every attacker as a thread; all end when the phase does."""
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=_slow_client, args=(port, until)) for _ in range(slow)]
    threads += [
        threading.Thread(target=_oversized_client, args=(port, until)) for _ in range(oversized)
    ]
    threads += [threading.Thread(target=_idle_client, args=(port, until)) for _ in range(idle)]
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(timeout=seconds + 40)


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def phase(port: int, a: argparse.Namespace, attack: bool) -> tuple[AgentFigures, int, float, float]:
    """Run agents (and attackers) for ``a.seconds``; return agents' figures, peak threads,
    peak RSS and RSS before."""
    attackers = None
    if attack:
        ctx = multiprocessing.get_context("spawn")
        attackers = ctx.Process(
            target=_attackers, args=(port, a.seconds, a.slow, a.oversized, a.idle), daemon=True
        )
        attackers.start()
        time.sleep(1.0)  # let them take their connections first
    rss0 = _rss_mib()
    until = time.monotonic() + a.seconds
    figures = [AgentFigures() for _ in range(a.agents)]
    agents = [
        threading.Thread(
            target=_agent, args=(port, f"node{i:03d}", until, a.every, a.per_batch, figures[i])
        )
        for i in range(a.agents)
    ]
    for t in agents:
        t.start()
    peak_threads, peak_rss = 0, rss0
    while any(t.is_alive() for t in agents):
        peak_threads = max(peak_threads, threading.active_count() - a.agents - 1)
        peak_rss = max(peak_rss, _rss_mib())
        time.sleep(0.05)
    if attackers is not None:
        attackers.join(timeout=a.seconds + 60)
        if attackers.is_alive():
            attackers.kill()
    total = AgentFigures()
    for f in figures:
        total.sent += f.sent
        total.stored += f.stored
        total.retries_503 += f.retries_503
        total.failures += f.failures
        total.latencies += f.latencies
    return total, peak_threads, peak_rss, rss0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--every", type=float, default=0.25, help="seconds between an agent's batches")
    ap.add_argument("--per-batch", type=int, default=200)
    ap.add_argument("--slow", type=int, default=40, help="slowloris clients")
    ap.add_argument("--oversized", type=int, default=6, help="8 MiB unauthenticated clients")
    ap.add_argument("--idle", type=int, default=20, help="clients that connect and say nothing")
    add_arguments(ap, "3 s phases, 2 agents, 10 slow, 2 oversized, 4 idle clients")
    a = ap.parse_args()
    if a.smoke:
        a.seconds, a.agents, a.slow, a.oversized, a.idle = 3.0, 2, 10, 2, 4
    run = BenchRun.from_args("api_load", a)
    logging.getLogger("slurmgpu.api").setLevel(logging.ERROR)  # a line per refused attacker
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/s.db")
        nodes = tuple(Node(f"node{i:03d}", "mixed", address="127.0.0.1") for i in range(NODES))
        snap = ClusterSnapshot(taken_at=datetime.now(UTC), jobs=(), nodes=nodes)
        directory = NodeDirectory(lambda: snap)
        auth = Authenticator(
            site_secret=SECRET, allow_munge=False, node_addresses=directory.addresses
        )
        service = IngestService(UsageStore(store.engine), auth, directory)
        server = ApiServer(service, "127.0.0.1", 0)
        server.start()
        port = server.address[1]
        try:
            base, base_threads, base_rss, rss0 = phase(port, a, attack=False)
            hit, hit_threads, hit_rss, _ = phase(port, a, attack=True)
            stats = server.stats
            stored_rows = service.usage.count_samples()
        finally:
            server.stop()

    def lat(f: AgentFigures, q: float) -> float:
        xs = sorted(f.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    limit = server.limits.max_connections
    print(
        f"{a.seconds:g} s per phase, {a.agents} agents every {a.every:g} s "
        f"({a.per_batch} samples a batch); attack: {a.slow} slow, {a.oversized} x 8 MiB "
        f"unauthenticated, {a.idle} idle clients; connection limit {limit}"
    )
    print(
        f"{'':28}{'stored/sent':>12}{'median ms':>11}{'p99 ms':>9}{'503s':>6}"
        f"{'threads':>9}{'RSS MiB':>9}"
    )
    for label, f, th, rss in (
        ("baseline (agents alone)", base, base_threads, base_rss),
        ("under attack", hit, hit_threads, hit_rss),
    ):
        print(
            f"{label:28}{f'{f.stored}/{f.sent}':>12}{lat(f, 0.5):>11.1f}{lat(f, 0.99):>9.1f}"
            f"{f.retries_503:>6}{th:>9}{rss:>9.0f}"
        )
    print(
        f"server: {stats.overloaded} connections answered 503 (slots full), "
        f"{stats.peer_overloaded} (their address's slots full), "
        f"{stats.timeouts} cut off by a timeout, {service.rejected} requests refused "
        f"(401/403/413); {stored_rows:,} samples stored"
    )
    all_stored = hit.stored == hit.sent and base.stored == base.sent
    threads_ok = hit_threads <= limit + 4
    growth = hit_rss - rss0
    rss_ok = growth < 8 * a.oversized
    print(
        f"every agent batch stored: {'OK' if all_stored else 'MISSED'}; server threads "
        f"{hit_threads} <= {limit} + 4: {'OK' if threads_ok else 'MISSED'}; RSS grew "
        f"{growth:.0f} MiB < {8 * a.oversized} MiB: {'OK' if rss_ok else 'MISSED'}"
    )
    run.baseline = {
        "stored": base.stored,
        "sent": base.sent,
        "median_ms": lat(base, 0.5),
        "p99_ms": lat(base, 0.99),
        "threads": base_threads,
        "rss_mib": base_rss,
    }
    run.figures = {
        "stored": hit.stored,
        "sent": hit.sent,
        "median_ms": lat(hit, 0.5),
        "p99_ms": lat(hit, 0.99),
        "agent_503s": hit.retries_503,
        "threads": hit_threads,
        "rss_mib": hit_rss,
        "server_overloaded": stats.overloaded,
        "server_peer_overloaded": stats.peer_overloaded,
        "server_timeouts": stats.timeouts,
        "server_refused": service.rejected,
    }
    run.target("agent_batches_stored", hit.stored / max(hit.sent, 1), "== 1", all_stored)
    run.target("server_threads", hit_threads, f"<= {limit + 4}", threads_ok)
    run.target("rss_growth_mib", growth, f"< {8 * a.oversized}", rss_ok)
    run.write(a.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
