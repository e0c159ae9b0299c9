"""The API's part of /metrics: its limits, connections and refusals (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from slurmgpu.daemon.api_limits import ApiLimits, ApiStats
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.wire import MAX_BODY_BYTES


class ApiCollector(Collector):
    """The API's limits, its counters and its refusals, read at each scrape."""

    def __init__(self, limits: ApiLimits, stats: ApiStats, service: IngestService) -> None:
        self.limits = limits
        self.stats = stats
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        limits, stats, auth = self.limits, self.stats, self.service.auth
        yield GaugeMetricFamily(
            "sgpu_api_connections", "API connections being served.", value=stats.active
        )
        yield GaugeMetricFamily(
            "sgpu_api_connections_limit",
            "API connections served at once; more are answered 503 + Retry-After.",
            value=limits.max_connections,
        )
        yield CounterMetricFamily(
            "sgpu_api_overloaded",
            "API connections answered 503 because every connection slot was taken.",
            value=stats.overloaded,
        )
        yield CounterMetricFamily(
            "sgpu_api_peer_overloaded",
            "API connections answered 503 because their address held max_per_peer connections.",
            value=stats.peer_overloaded,
        )
        yield GaugeMetricFamily(
            "sgpu_api_connections_per_peer_limit",
            "API connections served at once from one address.",
            value=limits.max_per_peer,
        )
        yield CounterMetricFamily(
            "sgpu_api_timeouts",
            "API connections closed: a read idle past the idle timeout, or a request past"
            " the request timeout.",
            value=stats.timeouts,
        )
        yield GaugeMetricFamily(
            "sgpu_api_pending_connections",
            "API connections still sending their request line and headers.",
            value=stats.pending,
        )
        pending = GaugeMetricFamily(
            "sgpu_api_pending_connections_limit",
            "API connections sending headers at once, in all and from one address.",
            labels=["scope"],
        )
        pending.add_metric(["all"], limits.max_pending)
        pending.add_metric(["peer"], limits.max_pending_per_peer)
        yield pending
        yield CounterMetricFamily(
            "sgpu_api_pending_overloaded",
            "API connections closed at once: too many were sending headers.",
            value=stats.pending_overloaded,
        )
        rejected = CounterMetricFamily(
            "sgpu_api_rejected",
            "API requests refused, by reason (each logged at most once a minute per peer).",
            labels=["reason"],
        )
        for reason, count in sorted(self.service.rejections.snapshot().items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield CounterMetricFamily(
            "sgpu_api_rejection_log_lines",
            "Log lines written about refused API requests (the rest were counted only).",
            value=self.service.rejections.lines,
        )
        yield GaugeMetricFamily(
            "sgpu_api_max_header_bytes",
            "Largest request line and headers read.",
            value=limits.max_header_bytes,
        )
        timeouts = GaugeMetricFamily(
            "sgpu_api_timeout_seconds", "API time limits by kind.", labels=["kind"]
        )
        timeouts.add_metric(["headers"], limits.header_timeout_s)
        timeouts.add_metric(["idle"], limits.idle_timeout_s)
        timeouts.add_metric(["request"], limits.request_timeout_s)
        timeouts.add_metric(["munge"], auth.munge_timeout_s)
        yield timeouts
        yield GaugeMetricFamily(
            "sgpu_api_max_body_bytes", "Largest request body accepted.", value=MAX_BODY_BYTES
        )
        yield GaugeMetricFamily(
            "sgpu_api_munge_decodes", "MUNGE credentials being decoded.", value=auth.munge_active
        )
        yield GaugeMetricFamily(
            "sgpu_api_munge_decodes_limit",
            "MUNGE credentials decoded at once.",
            value=auth.max_munge_decodes,
        )
        yield CounterMetricFamily(
            "sgpu_api_munge_busy",
            "Requests answered 503: every MUNGE decode slot stayed taken.",
            value=auth.munge_busy,
        )
