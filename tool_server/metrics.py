"""Prometheus metrics, one registry per app (tests run several apps in one process).

Per-call counters and latency histograms are plain integers updated on the hot
path and turned into Prometheus families only when /metrics is scraped: the
client library's labelled children cost more per update than the batched path
spends on a whole call (figures in bench/README.md).
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ToolStats:
    """Outcome counts and a latency histogram of one tool."""

    __slots__ = ("outcomes", "buckets", "total_s")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total_s = 0.0

    def record(self, outcome: str, seconds: float) -> None:
        outcomes = self.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total_s += seconds


class ToolStatsCollector(Collector):
    def __init__(self) -> None:
        self.tools: dict[str, ToolStats] = {}

    def for_tool(self, name: str) -> ToolStats:
        stats = self.tools.get(name)
        if stats is None:
            stats = self.tools[name] = ToolStats()
        return stats

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        calls = CounterMetricFamily(
            "toolfactory_calls", "Tool calls by tool and outcome", labels=["tool", "outcome"]
        )
        latency = HistogramMetricFamily("toolfactory_call_seconds", "Tool call latency", labels=["tool"])
        for name, stats in sorted(self.tools.items()):
            for outcome, count in sorted(stats.outcomes.items()):
                calls.add_metric([name, outcome], count)
            latency.add_metric([name], _cumulative(LATENCY_BUCKETS, stats.buckets), stats.total_s)
        yield calls
        yield latency


GC_PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class GcPauses(Collector):
    """How long garbage collections held the process (so the event loop), by generation.

    Fed by ``gc.callbacks`` while ``watch``ed (the server's lifespan), in wall time (what a
    waiting client sees) and in the collecting thread's CPU time (what the collection itself
    cost: on a loaded machine the wall time also counts time the process was not scheduled).
    """

    def __init__(self) -> None:
        self.buckets = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(3)]
        self.cpu_buckets = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(3)]
        self.total_s = [0.0, 0.0, 0.0]
        self.total_cpu_s = [0.0, 0.0, 0.0]
        self.longest_s = 0.0
        self.longest_cpu_s = 0.0
        self._began = (0.0, 0.0)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = (time.perf_counter(), time.thread_time())
            return
        wall, cpu = time.perf_counter() - self._began[0], time.thread_time() - self._began[1]
        generation = info["generation"]
        self.buckets[generation][bisect_left(GC_PAUSE_BUCKETS, wall)] += 1
        self.cpu_buckets[generation][bisect_left(GC_PAUSE_BUCKETS, cpu)] += 1
        self.total_s[generation] += wall
        self.total_cpu_s[generation] += cpu
        self.longest_s = max(self.longest_s, wall)
        self.longest_cpu_s = max(self.longest_cpu_s, cpu)

    def watch(self) -> None:
        if self.on_gc not in gc.callbacks:
            gc.callbacks.append(self.on_gc)

    def unwatch(self) -> None:
        if self.on_gc in gc.callbacks:
            gc.callbacks.remove(self.on_gc)

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        for name, what, buckets, totals in (
            ("toolfactory_gc_pause_seconds", "wall time", self.buckets, self.total_s),
            ("toolfactory_gc_pause_cpu_seconds", "CPU time", self.cpu_buckets, self.total_cpu_s),
        ):
            pauses = HistogramMetricFamily(
                name,
                f"Garbage collections by generation and how long each held the process ({what})",
                labels=["generation"],
            )
            for generation in range(3):
                pauses.add_metric(
                    [str(generation)], _cumulative(GC_PAUSE_BUCKETS, buckets[generation]), totals[generation]
                )
            yield pauses
        yield GaugeMetricFamily(
            "toolfactory_gc_pause_longest_seconds",
            "The longest garbage collection, wall time",
            self.longest_s,
        )
        yield GaugeMetricFamily(
            "toolfactory_gc_pause_longest_cpu_seconds",
            "The longest garbage collection, CPU time of the collecting thread",
            self.longest_cpu_s,
        )


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, int]]:
    """Per-bucket counts as a Prometheus histogram's cumulative buckets (``+Inf`` last)."""
    cumulative, running = [], 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        cumulative.append((str(bound) if bound != float("inf") else "+Inf", running))
    return cumulative


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tool_stats = ToolStatsCollector()
        r.register(self.tool_stats)
        self.gc_pauses = GcPauses()
        r.register(self.gc_pauses)
        self.in_flight = Gauge("toolfactory_calls_in_flight", "Calls running now", registry=r)
        self.queue_depth = Gauge(
            "toolfactory_queue_depth", "Calls admitted and waiting for a slot", registry=r
        )
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
        self.replays = Counter(
            "toolfactory_idempotent_replays", "Retried call_ids answered from storage", registry=r
        )
        self.upstream_up = Gauge(
            "toolfactory_upstream_up", "Upstream MCP server healthy (1) or not", ["server"], registry=r
        )
        self.store_entries = Gauge(
            "toolfactory_store_entries",
            "Results held (idempotency store, result cache)",
            ["store"],
            registry=r,
        )
        self.store_bytes = Gauge(
            "toolfactory_store_bytes",
            "Estimated memory of the results held (bounded by idempotency/cache max_bytes)",
            ["store"],
            registry=r,
        )
        self.tool_gauges = Gauge(
            "toolfactory_tool_gauge",
            "Figures a tool reports about itself (e.g. its sandbox fleet)",
            ["tool", "name"],
            registry=r,
        )
        self.connections_open = Gauge("toolfactory_connections_open", "Open client connections", registry=r)
        self.connection_events = Gauge(
            "toolfactory_connection_events_total",
            "Connections refused (503), evicted at the cap, or closed by a header/body timeout",
            ["event"],
            registry=r,
        )
        self.upstream_restarts = Gauge(
            "toolfactory_upstream_restarts", "Restarts of an upstream MCP server", ["server"], registry=r
        )
