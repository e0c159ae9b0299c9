"""Load test of the ingest API under hostile peers, on 127.0.0.1 only; stops by itself.

One API server (slurmgpu.daemon.api, default ApiLimits) on a loopback port of its own
(port 0). For ``--seconds``, in two phases measured in the same run:

- baseline: ``--agents`` authenticated agents, each POSTing a signed batch of
  ``--per-batch`` samples every ``--every`` seconds, one connection per request, as
  ``sgpu agent`` does (a 503 is retried after its Retry-After, at most 5 times);
- under attack: the same agents while, in another process (agents come from 127.0.0.1;
  every attacker from other loopback addresses, i.e. other hosts):

  - ``--slow`` slowloris clients trickling request headers a byte every 0.5 s, spread over
    ``--slow-addresses`` addresses (127.0.0.10…);
  - ``--forged`` clients sending POST headers with a made-up ``Sgpu-HMAC`` signature of a
    real node and a current timestamp that claim an 8 MiB body, then streaming it, over
    ``--forged-addresses`` addresses (127.0.0.20…) (issue 36: before the signature
    covered the body's length and digest, such a header passed the pre-body check);
  - ``--bad-auth`` threads sending small requests with bad credentials as fast as they
    are answered, from 127.0.0.30 (the log flood of issue 36);
  - ``--idle`` clients that connect and say nothing, from 127.0.0.2.

  Every attacker stops when the phase ends.

Printed and recorded: agent batches stored / sent, agent request latency (median, p99),
503s the agents met, the server's threads and resident memory at their peak, what the
server refused (by reason, and 503s and timeouts) and the log lines it wrote about it.
Targets: every agent batch is stored under attack; threads stay within the connection
limits (served + pending); memory grows less than the pre-authentication bound (every
pending and served connection holding its read buffer, headers and thread stack: no
unauthenticated body is ever read); at most one log line per refusal reason and peer per
minute.

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

from slurmgpu import wire
from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.model import ClusterSnapshot, Node
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import MAX_BODY_BYTES, GpuSampleIn, SampleBatch, encode, hmac_header, node_token

SECRET = b"L" * 64
NODES = 64
ATTACKER = ("127.0.0.2", 0)  # another loopback address: the attackers are another host
SLOW_BASE, FORGED_BASE, BAD_AUTH = 10, 20, "127.0.0.30"
# Before issue 36 a token header did not name the body's length and digest: the bench
# forges the form the library under test reads, so it can be run against either.
_NEW_HEADER = hasattr(wire, "parse_hmac")
PENDING_STACK_KIB = 64  # a thread's stack pages touched while it reads headers (measured ~40)


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


def _slow_client(port: int, until: float, source: str) -> None:
    """Slowloris: request headers a byte at a time, a new connection when cut off."""
    line = b"POST /v1/samples HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100_000
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), 5, (source, 0)) as s:
                for b in line:
                    if time.monotonic() >= until:
                        return
                    s.sendall(bytes([b]))
                    time.sleep(0.5)
        except OSError:
            time.sleep(0.2)


def _forged_header() -> str:
    now = int(time.time())
    if _NEW_HEADER:
        return (
            f"Sgpu-HMAC node=node000,ts={now},nonce={'0' * 32},len={MAX_BODY_BYTES},"
            f"sha256={'0' * 64},sig={'0' * 64}"
        )
    return f"Sgpu-HMAC node=node000,ts={now},sig={'0' * 64}"


def _forged_client(port: int, until: float, source: str) -> None:
    """POSTs with a made-up signature of a real node claiming 8 MiB, body streamed."""
    chunk = b"x" * 65536
    while time.monotonic() < until:
        head = (
            f"POST /v1/samples HTTP/1.1\r\nHost: x\r\nAuthorization: {_forged_header()}\r\n"
            f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n"
        )
        try:
            with socket.create_connection(("127.0.0.1", port), 5, (source, 0)) as s:
                s.sendall(head.encode())
                for _ in range(MAX_BODY_BYTES // len(chunk)):
                    if time.monotonic() >= until:
                        return
                    s.sendall(chunk)
                s.recv(4096)
        except OSError:
            time.sleep(0.05)


def _bad_auth_client(port: int, until: float) -> None:
    """Small requests with bad credentials, each on a new connection, as fast as answered."""
    request = (
        b"GET /v1/nodes/node000/jobs HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Sgpu-HMAC node=node000,ts=1,sig=00\r\nConnection: close\r\n\r\n"
    )
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), 5, (BAD_AUTH, 0)) as s:
                s.sendall(request)
                while s.recv(65536):
                    pass
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


@dataclass(frozen=True)
class Attack:
    slow: int
    slow_addresses: int
    forged: int
    forged_addresses: int
    bad_auth: int
    idle: int


def _attackers(port: int, seconds: float, attack: Attack) -> None:
    """Child process: every attacker as a thread; all end when the phase does."""
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=_slow_client,
            args=(port, until, f"127.0.0.{SLOW_BASE + i % attack.slow_addresses}"),
        )
        for i in range(attack.slow)
    ]
    threads += [
        threading.Thread(
            target=_forged_client,
            args=(port, until, f"127.0.0.{FORGED_BASE + i % attack.forged_addresses}"),
        )
        for i in range(attack.forged)
    ]
    threads += [
        threading.Thread(target=_bad_auth_client, args=(port, until))
        for _ in range(attack.bad_auth)
    ]
    threads += [
        threading.Thread(target=_idle_client, args=(port, until)) for _ in range(attack.idle)
    ]
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


def phase(
    port: int, a: argparse.Namespace, attack: Attack | None
) -> tuple[AgentFigures, int, float, float]:
    """Run agents (and attackers) for ``a.seconds``; return agents' figures, peak threads,
    peak RSS and RSS before."""
    attackers = None
    if attack is not None:
        ctx = multiprocessing.get_context("spawn")
        attackers = ctx.Process(target=_attackers, args=(port, a.seconds, attack), daemon=True)
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


class _LineCounter(logging.Handler):
    """Counts the lines the API logs at WARNING or above (written nowhere)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines = 0
        self.sample: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1
        if len(self.sample) < 3:
            self.sample.append(record.getMessage()[:160])


def _pre_auth_bound_mib(limits: object) -> float:
    """What every connection the server takes in may hold before it is authenticated:
    its 64 KiB read buffer, its headers (at most max_header_bytes) and its thread's stack,
    for every pending and served connection; no unauthenticated body is read."""
    pending = int(getattr(limits, "max_pending", 0))
    served = int(getattr(limits, "max_connections", 32))
    header = int(getattr(limits, "max_header_bytes", 65536 * 100)) / 1024
    return (pending + served) * (64 + header + PENDING_STACK_KIB) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--every", type=float, default=0.25, help="seconds between an agent's batches")
    ap.add_argument("--per-batch", type=int, default=200)
    ap.add_argument("--slow", type=int, default=40, help="slowloris clients")
    ap.add_argument("--slow-addresses", type=int, default=5)
    ap.add_argument("--forged", type=int, default=32, help="forged-signature 8 MiB clients")
    ap.add_argument("--forged-addresses", type=int, default=4)
    ap.add_argument("--bad-auth", type=int, default=8, help="bad-credential request threads")
    ap.add_argument("--idle", type=int, default=20, help="clients that connect and say nothing")
    add_arguments(ap, "3 s phases, 2 agents, 10 slow, 8 forged, 2 bad-auth, 4 idle clients")
    ap.add_argument(
        "--only",
        choices=["slow", "forged", "bad-auth", "idle"],
        action="append",
        help="run only these attackers (repeatable; default: all), to see each one's cost",
    )
    a = ap.parse_args()
    if a.smoke:
        a.seconds, a.agents, a.slow, a.forged, a.bad_auth, a.idle = 3.0, 2, 10, 8, 2, 4
    for kind in ("slow", "forged", "bad-auth", "idle") if a.only else ():
        if kind not in a.only:
            setattr(a, kind.replace("-", "_"), 0)
    attack = Attack(a.slow, a.slow_addresses, a.forged, a.forged_addresses, a.bad_auth, a.idle)
    run = BenchRun.from_args("api_load", a)
    api_log = logging.getLogger("slurmgpu.api")
    api_log.setLevel(logging.WARNING)
    api_log.propagate = False
    counter = _LineCounter()
    api_log.addHandler(counter)
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
            base, base_threads, base_rss, rss0 = phase(port, a, None)
            base_lines = counter.lines
            hit, hit_threads, hit_rss, _ = phase(port, a, attack)
            hit_lines = counter.lines - base_lines
            stats = server.stats
            stored_rows = service.usage.count_samples()
        finally:
            server.stop()
    rejections = getattr(service, "rejections", None)
    by_reason = rejections.snapshot() if rejections is not None else {"all": service.rejected}

    def lat(f: AgentFigures, q: float) -> float:
        xs = sorted(f.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    limits = server.limits
    limit = limits.max_connections
    pending_limit = int(getattr(limits, "max_pending", 0))
    print(
        f"{a.seconds:g} s per phase, {a.agents} agents every {a.every:g} s "
        f"({a.per_batch} samples a batch); attack: {a.slow} slow from {a.slow_addresses} "
        f"addresses, {a.forged} forged 8 MiB from {a.forged_addresses}, {a.bad_auth} bad-auth "
        f"threads, {a.idle} idle; limits: {limit} served, {pending_limit} pending"
        f"{'' if _NEW_HEADER else ' (library before issue 36: old header form)'}"
    )
    print(
        f"{'':28}{'stored/sent':>12}{'median ms':>11}{'p99 ms':>9}{'503s':>6}"
        f"{'threads':>9}{'RSS MiB':>9}{'log lines':>10}"
    )
    for label, f, th, rss, lines in (
        ("baseline (agents alone)", base, base_threads, base_rss, base_lines),
        ("under attack", hit, hit_threads, hit_rss, hit_lines),
    ):
        print(
            f"{label:28}{f'{f.stored}/{f.sent}':>12}{lat(f, 0.5):>11.1f}{lat(f, 0.99):>9.1f}"
            f"{f.retries_503:>6}{th:>9}{rss:>9.0f}{lines:>10}"
        )
    print(
        f"server: {stats.overloaded} connections answered 503 (slots full), "
        f"{stats.peer_overloaded} (their address's slots full), "
        f"{getattr(stats, 'pending_overloaded', 0)} closed (too many sending headers), "
        f"{stats.timeouts} cut off by a timeout; refused by reason: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(by_reason.items()))
        + f"; {stored_rows:,} samples stored"
    )
    for line in counter.sample:
        print(f"  log: {line}")
    all_stored = hit.stored == hit.sent and base.stored == base.sent
    thread_limit = limit + pending_limit + 4
    threads_ok = hit_threads <= thread_limit
    growth = hit_rss - rss0
    bound = _pre_auth_bound_mib(limits)
    rss_ok = growth < bound
    peers = a.slow_addresses + a.forged_addresses + 2  # + the bad-auth and idle addresses
    line_limit = peers * max(1, len(by_reason)) * (1 + int(a.seconds // 60))
    lines_ok = hit_lines <= line_limit
    print(
        f"every agent batch stored: {'OK' if all_stored else 'MISSED'}; server threads "
        f"{hit_threads} <= {thread_limit}: {'OK' if threads_ok else 'MISSED'}; RSS grew "
        f"{growth:.0f} MiB < pre-auth bound {bound:.0f} MiB: {'OK' if rss_ok else 'MISSED'}; "
        f"log lines {hit_lines} <= {line_limit} (reasons x peers x minutes): "
        f"{'OK' if lines_ok else 'MISSED'}"
    )
    run.baseline = {
        "stored": base.stored,
        "sent": base.sent,
        "median_ms": lat(base, 0.5),
        "p99_ms": lat(base, 0.99),
        "threads": base_threads,
        "rss_mib": base_rss,
        "log_lines": base_lines,
    }
    run.figures = {
        "stored": hit.stored,
        "sent": hit.sent,
        "median_ms": lat(hit, 0.5),
        "p99_ms": lat(hit, 0.99),
        "agent_503s": hit.retries_503,
        "threads": hit_threads,
        "rss_mib": hit_rss,
        "rss_growth_mib": growth,
        "log_lines": hit_lines,
        "server_overloaded": stats.overloaded,
        "server_peer_overloaded": stats.peer_overloaded,
        "server_pending_overloaded": getattr(stats, "pending_overloaded", 0),
        "server_timeouts": stats.timeouts,
        "server_refused": service.rejected,
        "refused_by_reason": by_reason,
    }
    run.target("agent_batches_stored", hit.stored / max(hit.sent, 1), "== 1", all_stored)
    run.target("server_threads", hit_threads, f"<= {thread_limit}", threads_ok)
    run.target("rss_growth_mib", growth, f"< {bound:.0f}", rss_ok)
    run.target("log_lines", hit_lines, f"<= {line_limit}", lines_ok)
    run.write(a.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
