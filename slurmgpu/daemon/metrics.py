"""The daemon's Prometheus metrics, served at ``GET /metrics`` on the API port.

Two kinds of figures:

- counted as they happen (the loop and the API call in): cycle durations, cycles by
  outcome, Slurm call errors by kind, samples ingested and requests rejected;
- read when scraped: GPUs by partition (also in GPU-equivalents, a MIG slice or MPS
  share as its part of a GPU: daemon/equivalent_metrics.py), and by user for a bounded
  number of users (daemon/user_metrics.py), from the daemon's latest snapshot and the agents' recent
  samples; when each node's agent last delivered samples; decisions by policy, mode
  and outcome, and transactions by kind and state, with one GROUP BY each from the
  store; each GPU's power and NVML energy counter from its samples of the last 2
  minutes (a scrape every 15-60 s costs four small queries, nothing per job).

A registry per daemon (not the process-global one), so tests can run several.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from sqlalchemy import Engine, and_, func, select
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu import userinput_stats
from slurmgpu.daemon.equivalent_metrics import equivalent_families
from slurmgpu.daemon.observer import CycleResult
from slurmgpu.daemon.shard_metrics import allocated_gpu_count, allocated_gpus, shard_families
from slurmgpu.daemon.user_metrics import user_families, user_gpus
from slurmgpu.model import ClusterSnapshot
from slurmgpu.slurm import decode_stats
from slurmgpu.store import schema
from slurmgpu.store.energy_rule import IDLE_UTIL_PCT
from slurmgpu.store.sample_ingest import SKEW_LIMIT_S
from slurmgpu.store.usage import UsageStore

log = logging.getLogger("slurmgpu.metrics")

__all__ = ["CONTENT_TYPE_LATEST", "DaemonMetrics", "error_kind"]

# A GPU counts as used when one of its samples in this window was busy: agents sample
# every 10 s by default, so two minutes tolerate a few lost batches.
USED_WINDOW = timedelta(minutes=2)
# Users with their own sgpu_user_* series (daemon.metrics_max_users); the rest: "(other)".
MAX_USERS = 20
CYCLE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def error_kind(error: str) -> str:
    """The label of a failed cycle's error: unavailable, parse, slurm or store."""
    if error.startswith("slurm unavailable"):
        return "unavailable"
    if error.startswith("slurm output not understood"):
        return "parse"
    if error.startswith("slurm error"):
        return "slurm"
    return "store"


@dataclass(frozen=True, slots=True)
class _Watched:
    """A figure another part of the daemon keeps, read at scrape time."""

    name: str
    help: str
    kind: str  # "counter" | "gauge"
    label: str  # "" for a single value
    read: Callable[[], Mapping[str, float] | float]

    def metric(self) -> Metric:
        value = self.read()
        labels = [self.label] if self.label else []
        family: CounterMetricFamily | GaugeMetricFamily = (
            CounterMetricFamily(self.name, self.help, labels=labels)
            if self.kind == "counter"
            else GaugeMetricFamily(self.name, self.help, labels=labels)
        )
        if isinstance(value, Mapping):
            for key, v in sorted(value.items()):
                family.add_metric([key], v)
        else:
            family.add_metric([], value)
        return family


class _StoreCollector(Collector):
    """Figures read at scrape time from the snapshot and the store."""

    def __init__(
        self,
        engine: Engine,
        cluster: str,
        snapshot: Callable[[], ClusterSnapshot | None],
        clock: Callable[[], datetime],
        ingest_counts: Callable[[], tuple[int, int]] | None,
        max_users: int,
    ) -> None:
        self.engine = engine
        self.max_users = max_users
        self.last_seen: Callable[[], Mapping[str, float]] | None = None
        self.cluster = cluster
        self.snapshot = snapshot
        self.clock = clock
        self.ingest_counts = ingest_counts
        self.watched: list[_Watched] = []

    def collect(self) -> Iterator[Metric]:
        for w in self.watched:
            yield w.metric()
        if self.ingest_counts is not None:
            accepted, rejected = self.ingest_counts()
            yield CounterMetricFamily(
                "sgpu_samples_ingested",
                "Usage samples accepted from node agents (rate() is the ingest rate).",
                value=accepted,
            )
            yield CounterMetricFamily(
                "sgpu_ingest_rejected",
                "Agent requests rejected (authentication, bad payload, unknown node).",
                value=rejected,
            )
        yield from self._gpus()
        yield from _slurm_decode_metrics()
        yield _user_input_metric()
        try:
            yield from self._store_counts()
            yield from self._power()
        except SQLAlchemyError as exc:  # a scrape must never take the daemon down
            log.warning("metrics: cannot read the store: %s", str(exc).splitlines()[0])
            up = GaugeMetricFamily("sgpu_store_up", "1 when the last scrape could read the store.")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("sgpu_store_up", "1 when the last scrape could read the store.")
        up.add_metric([], 1)
        yield up

    def _busy_gpus(self) -> tuple[set[tuple[str, int]], dict[int, int]]:
        """(node, GPU) busy in the last 2 minutes, and how many busy GPUs each job had."""
        s = schema.samples
        since = self.clock() - USED_WINDOW
        stmt = (
            select(s.c.job_id, s.c.node, s.c.gpu_index)
            .where(
                s.c.cluster == self.cluster,
                s.c.kind == "gpu",
                s.c.at >= since,
                s.c.job_id.is_not(None),
                s.c.util_pct > IDLE_UTIL_PCT,
            )
            .group_by(s.c.job_id, s.c.node, s.c.gpu_index)
        )
        busy: set[tuple[str, int]] = set()
        by_job: dict[int, int] = {}
        with self.engine.connect() as conn:
            for job_id, node, index in conn.execute(stmt):
                if index is None:
                    continue
                busy.add((str(node), int(index)))
                by_job[int(job_id)] = by_job.get(int(job_id), 0) + 1
        return busy, by_job

    def _unknown_gpus(self) -> tuple[set[tuple[str, int]], dict[int, int]]:
        """(node, GPU) whose job had processes in the last 2 minutes but no sample said how
        busy (a MIG slice without GPM), and how many such GPUs each job had: neither used
        nor idle."""
        s = schema.samples
        stmt = (
            select(s.c.job_id, s.c.node, s.c.gpu_index)
            .where(
                s.c.cluster == self.cluster,
                s.c.kind == "gpu",
                s.c.at >= self.clock() - USED_WINDOW,
                s.c.job_id.is_not(None),
                s.c.gpu_index.is_not(None),
            )
            .group_by(s.c.job_id, s.c.node, s.c.gpu_index)
            .having(and_(func.max(s.c.util_pct).is_(None), func.max(s.c.processes) > 0))
        )
        unknown: set[tuple[str, int]] = set()
        by_job: dict[int, int] = {}
        with self.engine.connect() as conn:
            for job_id, node, index in conn.execute(stmt):
                unknown.add((str(node), int(index)))
                by_job[int(job_id)] = by_job.get(int(job_id), 0) + 1
        return unknown, by_job

    def _agents(self, snap: ClusterSnapshot | None) -> Metric:
        """Per node in Slurm's node list: when its agent last posted samples accepted."""
        family = GaugeMetricFamily(
            "sgpu_agent_last_seen_timestamp_seconds",
            "When a node's agent last delivered a sample batch the daemon accepted (Unix "
            "time; nodes in Slurm's node list heard from since the daemon started).",
            labels=["node"],
        )
        if self.last_seen is not None and snap is not None:
            seen = self.last_seen()
            for node in sorted(n.name for n in snap.nodes):
                if node in seen:
                    family.add_metric([node], seen[node])
        return family

    def _gpus(self) -> Iterable[Metric]:
        snap = self.snapshot()
        total = GaugeMetricFamily(
            "sgpu_gpus", "GPUs of the nodes in a partition.", labels=["partition"]
        )
        alloc = GaugeMetricFamily(
            "sgpu_gpus_allocated",
            "GPUs allocated to jobs (whole or through shards), by partition.",
            labels=["partition"],
        )
        used = GaugeMetricFamily(
            "sgpu_gpus_used",
            "Allocated GPUs busy in the last 2 minutes of agent samples, by partition.",
            labels=["partition"],
        )
        idle = GaugeMetricFamily(
            "sgpu_gpus_idle",
            "Allocated GPUs not busy in the last 2 minutes (allocated - used - util "
            "unknown), by partition.",
            labels=["partition"],
        )
        unknown_family = GaugeMetricFamily(
            "sgpu_gpus_util_unknown",
            "Allocated GPUs with job processes in the last 2 minutes but no known "
            "utilisation (a MIG slice on a board without GPM): neither used nor idle.",
            labels=["partition"],
        )
        if snap is not None:
            try:
                busy, by_job = self._busy_gpus()
                unknown, unknown_by_job = self._unknown_gpus()
            except SQLAlchemyError as exc:
                log.warning("metrics: cannot read samples: %s", str(exc).splitlines()[0])
                busy, by_job, unknown, unknown_by_job = set(), {}, set(), {}
            per: dict[str, list[int]] = {}
            for node in snap.nodes:
                # Held whole or through shards: a GPU with shard jobs is allocated too.
                allocated = allocated_gpus(node)
                n_alloc = allocated_gpu_count(node)
                n_used = len({i for n, i in busy if n == node.name} & allocated) if allocated else 0
                n_unknown = (
                    len({i for n, i in unknown - busy if n == node.name} & allocated)
                    if allocated
                    else 0
                )
                for part in node.partitions or ("",):
                    row = per.setdefault(part, [0, 0, 0, 0])
                    row[0] += node.gpus
                    row[1] += n_alloc
                    row[2] += n_used
                    row[3] += n_unknown
            for part, (n_total, n_alloc, n_used, n_unknown) in sorted(per.items()):
                total.add_metric([part], n_total)
                alloc.add_metric([part], n_alloc)
                used.add_metric([part], n_used)
                unknown_family.add_metric([part], n_unknown)
                idle.add_metric([part], max(n_alloc - n_used - n_unknown, 0))
            yield from shard_families(snap.nodes, busy)
            yield from equivalent_families(snap.nodes, snap.jobs, busy, unknown)
            # A GPU of unknown use is not counted idle against its user either.
            not_idle = {
                j: by_job.get(j, 0) + unknown_by_job.get(j, 0) for j in {*by_job, *unknown_by_job}
            }
            yield from user_families(user_gpus(snap.jobs, not_idle), self.max_users)
        yield from (total, alloc, used, idle, unknown_family)
        yield self._agents(snap)

    def _power(self) -> Iterable[Metric]:
        """Per GPU: mean power and the newest energy counter in the last 2 minutes."""
        s = schema.samples
        power = GaugeMetricFamily(
            "sgpu_gpu_power_watts",
            "Mean board power of a GPU over its agent samples of the last 2 minutes.",
            labels=["node", "gpu"],
        )
        energy = CounterMetricFamily(
            "sgpu_gpu_energy_joules",
            "A GPU's NVML total-energy counter (since the driver was loaded; Volta and "
            "newer), newest value of the last 2 minutes; rate() is its power.",
            labels=["node", "gpu"],
        )
        stmt = (
            select(s.c.node, s.c.gpu_index, func.avg(s.c.power_w), func.max(s.c.energy_mj))
            .where(
                s.c.cluster == self.cluster,
                s.c.at >= self.clock() - USED_WINDOW,
                s.c.kind == "gpu",
                s.c.gpu_index.is_not(None),
            )
            .group_by(s.c.node, s.c.gpu_index)
            .order_by(s.c.node, s.c.gpu_index)
        )
        with self.engine.connect() as conn:
            for node, index, watts, mj in conn.execute(stmt):
                labels = [str(node), str(index)]
                if watts is not None:
                    power.add_metric(labels, float(watts))
                if mj is not None:
                    energy.add_metric(labels, int(mj) / 1000.0)
        yield power
        yield energy

    def _store_counts(self) -> Iterable[Metric]:
        a, t = schema.actions, schema.transactions
        actions = CounterMetricFamily(
            "sgpu_actions",
            "Policy decisions recorded, by policy, kind, mode and outcome.",
            labels=["policy", "kind", "mode", "outcome"],
        )
        txs = GaugeMetricFamily(
            "sgpu_transactions",
            "Multi-step actions (resize, pool, ...) by kind and state.",
            labels=["kind", "state"],
        )
        with self.engine.connect() as conn:
            for policy, kind, mode, outcome, n in conn.execute(
                select(a.c.policy, a.c.kind, a.c.mode, a.c.outcome, func.count())
                .where(a.c.cluster == self.cluster)
                .group_by(a.c.policy, a.c.kind, a.c.mode, a.c.outcome)
            ):
                actions.add_metric([policy, kind, mode, outcome], int(n))
            for kind, state, n in conn.execute(
                select(t.c.kind, t.c.state, func.count())
                .where(t.c.cluster == self.cluster)
                .group_by(t.c.kind, t.c.state)
            ):
                txs.add_metric([kind, state], int(n))
        yield actions
        yield txs


def _user_input_metric() -> Metric:
    """What users wrote that the daemon refused (this process), by source."""
    rejected = CounterMetricFamily(
        "sgpu_user_input_rejected",
        "User-written input refused (a malleable job's ack.json or progress.json: a "
        "FIFO, a link, too large or too deeply nested...; a malformed comment token); "
        "that job alone goes without it.",
        labels=["source"],
    )
    for source, n in sorted(userinput_stats.counts().items()):
        rejected.add_metric([source], n)
    return rejected


def _slurm_decode_metrics() -> Iterator[Metric]:
    """What the Slurm decoders left out, and the data_parser versions seen (this process)."""
    stats = decode_stats.snapshot()
    skipped = CounterMetricFamily(
        "sgpu_slurm_records_skipped",
        "Slurm records (jobs, nodes) left out of a listing: bad bytes, shape or value.",
        labels=["listing"],
    )
    unparsed = CounterMetricFamily(
        "sgpu_slurm_values_unparsed",
        "Values in Slurm's output that did not parse (GRES details, states...); "
        "the rest of the record was used.",
        labels=["listing"],
    )
    for listing in ("squeue", "sinfo", "sacct"):
        skipped.add_metric([listing], stats.records_skipped.get(listing, 0))
        unparsed.add_metric([listing], stats.values_unparsed.get(listing, 0))
    parsers = GaugeMetricFamily(
        "sgpu_slurm_data_parser",
        "data_parser versions seen in Slurm's JSON; known=0 for one slurmgpu was not "
        "tested with (decoded where it could be).",
        labels=["version", "known"],
    )
    for version, known in sorted(stats.data_parsers.items()):
        parsers.add_metric([version, "1" if known else "0"], 1)
    yield skipped
    yield unparsed
    yield parsers


class DaemonMetrics:
    """The daemon's registry: the loop reports cycles, the API serves :meth:`exposition`."""

    def __init__(
        self,
        engine: Engine,
        cluster: str = "",
        *,
        snapshot: Callable[[], ClusterSnapshot | None] = lambda: None,
        ingest_counts: Callable[[], tuple[int, int]] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_users: int = MAX_USERS,
    ) -> None:
        self.registry = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "sgpu_cycle_duration_seconds",
            "Observe cycle duration (squeue + sinfo + diff + store).",
            buckets=CYCLE_BUCKETS_S,
            registry=self.registry,
        )
        self.cycles = Counter(
            "sgpu_cycles",
            "Observe cycles by outcome (ok, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.slurm_errors = Counter(
            "sgpu_slurm_errors",
            "Failed observe cycles by kind (unavailable, parse, slurm, store).",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("unavailable", "parse", "slurm", "store"):
            self.slurm_errors.labels(kind)  # present at 0, so rate() works from the start
        for outcome in ("ok", "failed"):
            self.cycles.labels(outcome)
        self._collector = _StoreCollector(
            engine, cluster, snapshot, clock, ingest_counts, max_users
        )
        self.registry.register(self._collector)
        self.last_cycle = Gauge(
            "sgpu_last_cycle_timestamp_seconds",
            "When the last successful observe cycle ended (Unix time).",
            registry=self.registry,
        )

    def watch_ingest(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Export (accepted samples, rejected requests) of the API as counters."""
        self._collector.ingest_counts = counts

    def watch_agents(self, last_seen: Callable[[], Mapping[str, float]]) -> None:
        """Export when each node's agent last delivered samples (node → Unix time)."""
        self._collector.last_seen = last_seen

    def watch(
        self,
        name: str,
        help_text: str,
        read: Callable[[], Mapping[str, float] | float],
        *,
        kind: str = "counter",
        label: str = "",
    ) -> None:
        """Export a figure kept elsewhere (policy errors, MUNGE up, skewed samples...)."""
        self._collector.watched.append(_Watched(name, help_text, kind, label, read))

    def watch_usage(self, usage: UsageStore) -> None:
        """Export what ingest counts per sample: refused, held, dropped from the hold, skewed, and
        the agents' spool drops."""
        self.watch(
            "sgpu_samples_refused",
            "Agent samples refused at ingest: job not on the posting node, GPU not allocated"
            " to the job, outside the job's run, no such GPU, stamped in the future.",
            lambda: dict(usage.refused),
            label="reason",
        )
        self.watch(
            "sgpu_ingest_samples_unverified",
            "Agent samples of a job the daemon had not seen (yet), held until Slurm lists"
            " it, by node.",
            lambda: dict(usage.unverified),
            label="node",
        )
        self.watch(
            "sgpu_samples_dropped",
            "Held samples dropped: not fitting their job's node, GPUs or run once listed"
            " (unverified_job), job not run within the hold's age limit (hold_expired),"
            " the node's hold full (hold_full).",
            lambda: dict(usage.hold.dropped),
            label="reason",
        )
        self.watch(
            "sgpu_samples_held",
            "Samples held (jobs not seen yet) after the last observe cycle.",
            lambda: float(usage.hold.held_now),
            kind="gauge",
        )
        self.watch(
            "sgpu_samples_skewed",
            f"Samples stamped over {SKEW_LIMIT_S:.0f}s from the daemon's clock (behind:"
            " stored; ahead: refused), by node.",
            lambda: dict(usage.skewed),
            label="node",
        )
        self.watch(
            "sgpu_agent_spool_dropped_samples",
            "Samples an agent's spool dropped so far (as the agent last reported), by node.",
            lambda: dict(usage.spool_dropped),
            label="node",
        )

    def cycle_done(self, result: CycleResult) -> None:
        """Count one observe cycle (called by the loop after every cycle)."""
        self.cycle_seconds.observe(result.seconds)
        self.cycles.labels("ok" if result.ok else "failed").inc()
        if not result.ok:
            self.slurm_errors.labels(error_kind(result.error)).inc()
        else:
            self.last_cycle.set(time.time())

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
