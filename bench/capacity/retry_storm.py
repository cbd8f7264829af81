"""Retry storm: far more concurrent calls than a server admits, with default server limits.

One client offers N calls of ``tools.testing:sleep`` (1 s each) at once to one server with
its default limits (512 running + 16,384 queued; beyond that a batch gets HTTP 429 with
``Retry-After: 1``). No schedule can finish before the capacity bound
N / max_concurrency x seconds (64k calls: 128 s). Printed side by side:

* wall time from submission to the last result, and its ratio to the capacity bound
  (target <= 1.1x);
* retries per call (re-sends after 429s and failures; target <= 1 on average) and
  attempts per call (calls carried by POSTs / N);
* error results by kind (target: none), server-side refusals (429s) and executions of
  ``sleep`` (must equal N: nothing ran twice), latency percentiles.

The client deadline is ``--timeout-s`` (default 300 s): the default 120 s is shorter than
the capacity bound itself, so with 64k calls the last ones could not make it under any
schedule.

Run: ``.venv/bin/python bench/capacity/retry_storm.py [--calls 65536] [--seconds 1.0]``
(``--calls 8192`` for a ~20 s smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from protocol import Call, Result, new_call_id  # noqa: E402
from tests.support.server import running_server, server_config  # noqa: E402
from tool_server.config import LimitsConfig  # noqa: E402
from trainer_client.client.tool_client import ToolClient  # noqa: E402


def server_counter(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample on the server's /metrics, filtered by labels."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def offer(url: str, calls: int, seconds: float, timeout_s: float) -> dict[str, Any]:
    """Offer every call at once (one caller per call, as concurrent trajectories do)."""
    async with ToolClient(url, timeout_s=timeout_s) as client:
        start = time.perf_counter()
        cpu = time.process_time()
        results: list[list[Result]] = await asyncio.gather(
            *(client.call_tools([Call(new_call_id(), "sleep", {"seconds": seconds})]) for _ in range(calls))
        )
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu
        metrics = client.metrics()
    errors = Counter(r.error.kind.value for (r,) in results if r.is_error and r.error is not None)
    return {"wall_s": wall, "client_cpu_s": cpu, "errors": errors, "metrics": metrics}


def report(
    args: argparse.Namespace, limits: LimitsConfig, run: dict[str, Any], server: dict[str, float]
) -> str:
    n = args.calls
    bound = n / limits.max_concurrency * args.seconds
    m = run["metrics"]
    latency = m["latency_ms"]
    rows = [
        ("calls offered at once", f"{n:,} x sleep({args.seconds:g} s)"),
        (
            "server limits",
            f"{limits.max_concurrency} running + {limits.max_queue:,} queued, "
            f"Retry-After {limits.retry_after_s} s",
        ),
        ("capacity bound", f"{bound:.1f} s"),
        ("wall, submission to last result", f"{run['wall_s']:.1f} s"),
        ("**wall / capacity bound**", f"**{run['wall_s'] / bound:.3f}x** (target <= 1.1x)"),
        ("**retries per call**", f"**{m['retries'] / n:.3f}** (target <= 1)"),
        ("attempts per call (calls carried by POSTs / N)", f"{m['calls_sent'] / n:.3f}"),
        ("**error results**", f"**{sum(run['errors'].values())}** {dict(run['errors']) or ''}".rstrip()),
        ("server: refused batches (429)", f"{server['refused']:.0f}"),
        ("server: sleep executions (must be N)", f"{server['executions']:,.0f}"),
        ("POSTs, mean calls per POST", f"{m['batches']:,}, {m['mean_batch_size']}"),
        (
            "latency p50 / p99 / max",
            f"{latency['p50'] / 1000:.1f} / {latency['p99'] / 1000:.1f} / {latency['max'] / 1000:.1f} s",
        ),
        ("client CPU", f"{run['client_cpu_s']:.1f} s ({run['client_cpu_s'] / n * 1e6:.0f} us per call)"),
    ]
    lines = ["| measure | value |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=65_536, help="calls offered at once (default 65,536)")
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of each sleep call (default 1)")
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="client deadline per call (default 300 s)"
    )
    args = parser.parse_args()
    if args.calls < 1 or args.seconds <= 0:
        parser.error("--calls must be >= 1 and --seconds > 0")
    limits = LimitsConfig()  # the server runs with these defaults
    with running_server(server_config()) as server:
        run = asyncio.run(offer(server.url, args.calls, args.seconds, args.timeout_s))
        counters = {
            "refused": server_counter(server.url, "toolfactory_rejected_batches_total"),
            "executions": server_counter(server.url, "toolfactory_calls_total", tool="sleep"),
        }
    print(f"\nretry storm — {os.cpu_count()} cores, one uvicorn worker, one ToolClient (default options)\n")
    print(report(args, limits, run, counters))


if __name__ == "__main__":
    main()
