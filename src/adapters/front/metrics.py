"""The front's metrics (R-API-7, R-REP-5) and its structured event log lines.

Pool events (`domain/fleet/ejection.py`) and replica lifecycle events both leave through
`FrontEvents`: one log line each (`replica_ejected deployment=… replica=… …`) and a counter.
"""

from __future__ import annotations

import logging

from vllm_srun.adapters.prometheus import SECONDS_BUCKETS, MetricsRegistry
from vllm_srun.domain.fleet.ejection import (
    EjectionWithheld,
    PoolEvent,
    ProbeHealth,
    ReplicaBackedOff,
    ReplicaEjected,
    ReplicaReadmitted,
)

log = logging.getLogger("vllm_srun.front")

# lifecycle events worth a warning rather than an info line
_WARNINGS = {
    "replica_unreachable",
    "replica_exited",
    "replica_failed",
    "replica_unhealthy",
    "replica_incompatible",
    "replica_killed",
}


REPLICA = ("deployment", "replica")  # the labels of every per-replica series


class FrontMetrics:
    """The front's metrics on a registry of its own; documented in docs/metrics.md."""

    def __init__(self) -> None:
        r = self.registry = MetricsRegistry()
        self.requests = r.counter(
            "vllm_sr_requests_total", "Requests answered by the front, by deployment and code", ("deployment", "code")
        )
        self.errors = r.counter("vllm_sr_errors_total", "Error responses of the front by code", ("code",))
        # keys and tenants (R-AUTH, R-FAIR-4): never a key, a digest or a path in a label
        self.auth_refusals = r.counter(
            "vllm_sr_auth_refusals_total",
            "Requests refused at the front's key check, by route class (api|metrics|other) and code",
            ("route", "code"),
        )
        self.tenant_refusals = r.counter(
            "vllm_sr_tenant_refusals_total",
            "429 answers of the front (its own or a worker's), by deployment and tenant",
            ("deployment", "tenant"),
        )
        self.request_seconds = r.histogram(
            "vllm_sr_request_duration_seconds", "Request time at the front", ("deployment",), SECONDS_BUCKETS
        )
        self.outcomes = r.counter(
            "vllm_sr_dispatch_outcomes_total", "Dispatched requests by replica and outcome", (*REPLICA, "outcome")
        )
        self.in_flight = r.gauge("vllm_sr_replica_in_flight", "Requests in flight per replica", REPLICA)
        self.outstanding = r.gauge(
            "vllm_sr_replica_outstanding_bytes", "Request bytes outstanding per replica", REPLICA
        )
        self.replica_ready = r.gauge("vllm_sr_replica_ready", "1 when the replica takes requests", REPLICA)
        self.ready_replicas = r.gauge("vllm_sr_ready_replicas", "Ready replicas per deployment", ("deployment",))
        self.restarts = r.counter("vllm_sr_replica_restarts_total", "Worker restarts per replica", REPLICA)
        self.ejections = r.counter("vllm_sr_ejections_total", "Outlier ejections per replica", REPLICA)
        self.readmissions = r.counter(
            "vllm_sr_readmissions_total", "Readmissions of ejected replicas, by reason", (*REPLICA, "reason")
        )
        self.withheld = r.counter(
            "vllm_sr_ejections_withheld_total", "Ejections withheld, by reason", (*REPLICA, "reason")
        )
        self.backoffs = r.counter(
            "vllm_sr_replica_backoffs_total", "Short backoffs after a failure or timeout", REPLICA
        )
        self.open_connections = r.gauge(
            "vllm_sr_open_connections", "Open client connections by phase, as of the scrape", ("phase",)
        )
        self.connections_closed = r.counter(
            "vllm_sr_connections_closed_total", "Client connections the front closed or refused, by reason", ("reason",)
        )
        self.cache = r.counter(
            "vllm_sr_result_cache_total", "Front result cache lookups by outcome (hit|miss)", ("deployment", "outcome")
        )
        # replicas found through DNS (`front/discovery.py`)
        self.dns_failures = r.counter(
            "vllm_sr_dns_resolution_failures_total",
            "Failed (or empty) resolutions of a deployment's DNS replica name; the last good set is kept",
            ("deployment",),
        )
        self.discovered = r.gauge(
            "vllm_sr_discovered_replicas",
            "Replicas a deployment serves from a DNS name, by name",
            ("deployment", "dns"),
        )

    def render(self) -> str:
        return self.registry.render()

    def auth_refused(self, route: str, code: str) -> None:
        """One refusal at the key check (`http/auth.AuthMiddleware`'s report)."""
        self.auth_refusals.inc({"route": route, "code": code})


class FrontEvents:
    """Turns pool and lifecycle events into logs and metrics."""

    def __init__(self, metrics: FrontMetrics) -> None:
        self.metrics = metrics

    def pool_event(self, deployment: str, event: PoolEvent) -> None:
        labels = {"deployment": deployment, "replica": event.replica}
        if isinstance(event, ReplicaEjected):
            self.metrics.ejections.inc(labels)
            log.warning(
                "replica_ejected deployment=%s replica=%s seconds=%g ejections_in_a_row=%d",
                deployment,
                event.replica,
                event.seconds,
                event.ejections_in_a_row,
            )
        elif isinstance(event, ReplicaReadmitted):
            self.metrics.readmissions.inc({**labels, "reason": event.reason})
            log.warning(
                "replica_readmitted deployment=%s replica=%s reason=%s", deployment, event.replica, event.reason
            )
        elif isinstance(event, EjectionWithheld):
            self.metrics.withheld.inc({**labels, "reason": event.reason})
            log.warning(
                "replica_ejection_withheld deployment=%s replica=%s reason=%s", deployment, event.replica, event.reason
            )
        elif isinstance(event, ReplicaBackedOff):
            self.metrics.backoffs.inc(labels)
            log.debug("replica_backoff deployment=%s replica=%s seconds=%g", deployment, event.replica, event.seconds)
        elif isinstance(event, ProbeHealth):
            pass  # the fleet probes; nothing to log

    def dns_failed(self, deployment: str) -> None:
        self.metrics.dns_failures.inc({"deployment": deployment})

    def discovered(self, deployment: str, name: str, count: int) -> None:
        self.metrics.discovered.set(count, {"deployment": deployment, "dns": name})

    def lifecycle(self, event: str, deployment: str, replica: str, detail: str) -> None:
        labels = {"deployment": deployment, "replica": replica}
        if event == "replica_restarted":
            self.metrics.restarts.inc(labels)
        if event == "replica_retired":  # its live gauges would otherwise stay at their last value
            for gauge in (self.metrics.in_flight, self.metrics.outstanding, self.metrics.replica_ready):
                gauge.remove(labels)
        level = logging.WARNING if event in _WARNINGS else logging.INFO
        log.log(level, "%s deployment=%s replica=%s %s", event, deployment, replica, detail)
