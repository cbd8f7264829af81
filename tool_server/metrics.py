"""Prometheus metrics, one registry per app (tests run several apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter("toolfactory_calls", "Tool calls by tool and outcome", ["tool", "outcome"], registry=r)
        self.latency = Histogram(
            "toolfactory_call_seconds", "Tool call latency", ["tool"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.in_flight = Gauge("toolfactory_calls_in_flight", "Calls running now", registry=r)
        self.queue_depth = Gauge("toolfactory_queue_depth", "Calls admitted and waiting for a slot", registry=r)
        self.sessions = Gauge("toolfactory_sessions", "Open sessions", registry=r)
        self.batches = Counter("toolfactory_batches", "Batch requests by endpoint", ["endpoint"], registry=r)
        self.batch_size = Histogram(
            "toolfactory_batch_size",
            "Calls per batch request",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
            registry=r,
        )
        self.rejected = Counter("toolfactory_rejected_batches", "Batches answered 429", registry=r)
        self.cache_hits = Counter("toolfactory_cache_hits", "Results served from the cache", registry=r)
        self.replays = Counter("toolfactory_idempotent_replays", "Retried call_ids answered from storage", registry=r)
        self.upstream_up = Gauge("toolfactory_upstream_up", "Upstream MCP server healthy (1) or not", ["server"], registry=r)
        self.upstream_restarts = Gauge(
            "toolfactory_upstream_restarts", "Restarts of an upstream MCP server", ["server"], registry=r
        )
