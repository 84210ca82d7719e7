"""Prometheus metrics, in a registry of the app's own (never the process-global one).

With ``--workers N`` every worker process has its own registry: ``GET /metrics`` answers for
the worker that took the connection. Scrape each worker (or sum in the dashboard).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from app.server import http_protocol

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_FIRST_EVENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The service's metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._add_run_metrics(self.registry)
        self._add_fencing_metrics(self.registry)
        self._add_webhook_metrics(self.registry)
        self._preset_labels()
        self.registry.register(_ConnectionCollector())

    def _add_run_metrics(self, r: CollectorRegistry) -> None:
        self.runs_total = Counter(
            "agent_runs", "Runs that ended, by outcome", ["outcome"], registry=r
        )
        self.runs_in_flight = Gauge(
            "agent_runs_in_flight", "Runs holding an execution slot", registry=r
        )
        self.runs_queued = Gauge(
            "agent_runs_queued", "Runs waiting for an execution slot", registry=r
        )
        self.runs_rejected = Counter(
            "agent_runs_rejected", "Run requests turned away, by reason", ["reason"], registry=r
        )
        self.run_duration = Histogram(
            "agent_run_duration_seconds",
            "Time from accepting a run (queue wait included) to its terminal event, by outcome",
            ["outcome"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.time_to_first_event = Histogram(
            "agent_run_time_to_first_event_seconds",
            "Time from accepting a run request to the run's first event",
            buckets=_FIRST_EVENT_BUCKETS,
            registry=r,
        )
        self.external_events = Counter(
            "agent_external_events", "External events received, by outcome", ["outcome"], registry=r
        )
        self.sse_streams = Gauge("agent_sse_streams", "Open SSE responses", registry=r)

    def _add_fencing_metrics(self, r: CollectorRegistry) -> None:
        # fencing (app.runs.fencing): what a worker cut off from its runs' leases did
        self.lease_renewals_failed = Counter(
            "agent_lease_renewals_failed",
            "Session lease renewals that were not confirmed (unreachable bus, or taken over)",
            registry=r,
        )
        self.checkpoints_saved = Counter(
            "agent_checkpoints_saved", "Run checkpoints stored (app.runs.checkpoints)", registry=r
        )
        self.runs_resumed = Counter(
            "agent_runs_resumed",
            "Runs resumed here from their checkpoint, by reason (worker_lost, shutdown)",
            ["reason"],
            registry=r,
        )
        self.runs_parked = Counter(
            "agent_runs_parked",
            "Runs handed over at shutdown: checkpoint parked, lease released",
            registry=r,
        )
        self.runs_fenced = Counter(
            "agent_runs_fenced",
            "Runs fenced off: stopped here because their lease deadline passed or their lease "
            "was taken over",
            registry=r,
        )
        self.tool_calls_after_lease = Counter(
            "agent_tool_calls_after_lease",
            "Tool calls still running when their run was fenced off: they finish after the "
            "run's lease",
            registry=r,
        )

    def _add_webhook_metrics(self, r: CollectorRegistry) -> None:
        # webhooks (app.webhooks.delivery): each attempt by what it led to
        self.webhook_attempts = Counter(
            "agent_webhook_attempts",
            "Webhook delivery attempts, by outcome: delivered, retry (due again later) or "
            "failed (given up)",
            ["outcome"],
            registry=r,
        )
        self.webhooks_pruned = Counter(
            "agent_webhooks_pruned",
            "Settled webhook messages deleted from the outbox after their retention",
            registry=r,
        )

    def _preset_labels(self) -> None:
        # every known label value shows from the start (at 0), so a rate() has a baseline
        for outcome in ("completed", "failed", "cancelled"):
            self.runs_total.labels(outcome)
        for outcome in ("delivered", "retry", "failed"):
            self.webhook_attempts.labels(outcome)
        for reason in (
            "session_busy",
            "overloaded",
            "queue_timeout",
            "principal_limit",
            "draining",
            "agent_unavailable",
            "budget_exceeded",
        ):
            self.runs_rejected.labels(reason)
        for outcome in ("accepted", "not_accepted", "not_found"):
            self.external_events.labels(outcome)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class _ConnectionCollector(Collector):
    """The connection guard's counts (``app.server.http_protocol.STATS``, one per process)."""

    def collect(self) -> Iterator[Metric]:
        stats = http_protocol.STATS
        yield GaugeMetricFamily(
            "agent_http_connections", "Open client connections", value=stats.open
        )
        refused = CounterMetricFamily(
            "agent_http_connections_closed",
            "Client connections closed by the server's limits, by reason",
            labels=["reason"],
        )
        refused.add_metric(["max_connections"], stats.refused)
        refused.add_metric(["header_timeout"], stats.header_timeouts)
        refused.add_metric(["header_too_large"], stats.headers_too_large)
        yield refused
