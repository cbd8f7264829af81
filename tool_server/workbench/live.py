"""The server's own Prometheus text as JSON for the workbench's live page.

Counters and histogram buckets are cumulative; the page turns two snapshots into rates
and windowed percentiles (the interval between polls is the page's to choose).
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metrics_snapshot"]

_GAUGES = {
    "toolfactory_calls_in_flight": "in_flight",
    "toolfactory_queue_depth": "queue_depth",
    "toolfactory_sessions": "sessions",
    "toolfactory_connections_open": "connections_open",
}


def metrics_snapshot(text: str) -> dict[str, Any]:
    """``{"tools": {name: {outcomes, buckets, sum}}, "gauges", "rejected", "cache_hits", ...}``."""
    tools: dict[str, dict[str, Any]] = {}
    gauges: dict[str, float] = {}
    snapshot: dict[str, Any] = {
        "tools": tools,
        "gauges": gauges,
        "rejected": 0.0,
        "cache_hits": 0.0,
        "upstreams": {},
        "connection_events": {},
    }

    def tool(name: str) -> dict[str, Any]:
        return tools.setdefault(name, {"outcomes": {}, "buckets": [], "sum": 0.0})

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "toolfactory_calls_total":
                tool(labels["tool"])["outcomes"][labels["outcome"]] = value
            elif name == "toolfactory_call_seconds_bucket":
                bound = labels["le"]
                tool(labels["tool"])["buckets"].append([None if bound == "+Inf" else float(bound), value])
            elif name == "toolfactory_call_seconds_sum":
                tool(labels["tool"])["sum"] = value
            elif name in _GAUGES:
                gauges[_GAUGES[name]] = value
            elif name == "toolfactory_rejected_batches_total":
                snapshot["rejected"] = value
            elif name == "toolfactory_cache_hits_total":
                snapshot["cache_hits"] = value
            elif name == "toolfactory_upstream_up":
                snapshot["upstreams"][labels["server"]] = value
            elif name == "toolfactory_connection_events_total":
                snapshot["connection_events"][labels["event"]] = value
    return snapshot
