"""Server throughput: the same trivial tool through five paths, side by side in one run.

(a) the executor in-process, (b) /v1/calls with 64 calls per POST, (c) /v1/calls with
one call per POST, (d) MCP 2026-07-28 as raw POSTs (ours, and the MCP SDK's own
low-level server as the baseline), (e) the official MCP client. Each at 32 and 1024
concurrent callers; one uvicorn worker per server; the load generator runs in this
process (the other core). The HTTP paths (b)-(d0) run ``--repeats`` times, interleaved,
and the table shows the fastest run of each with the range. Prints a markdown table
with ratios.

    python bench/server_throughput.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import LoadResult, build_post, percentile, run_load  # noqa: E402
from protocol import Call  # noqa: E402
from tests.support.server import running_server, server_config  # noqa: E402
from tool_server.config import config_from_dict  # noqa: E402

MCP_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "echo",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) a process has used so far; that process's own clock."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(pid: int | None, load: Awaitable[LoadResult]) -> tuple[LoadResult, float]:
    """Run a load and return it with the CPU seconds the serving process spent meanwhile."""
    before = cpu_seconds(pid)
    result = await load
    return result, cpu_seconds(pid) - before


async def warm_then_measure(
    pid: int,
    url: str,
    maker: Callable[[str], Callable[[int], bytes]],
    tag: str,
    concurrency: int,
    total: int,
    check: Callable[[int, bytes], bool],
    warm_requests: int = 0,
) -> tuple[LoadResult, float]:
    """Unmeasured warm-up, then the measured load.

    The warm-up is a tenth of the load (connections, first-call caches) or
    ``warm_requests``, whichever is more. ``maker(tag)`` builds the requests; the
    warm-up uses another tag so that its call ids never make the measured calls
    idempotent replays.
    """
    warm = max(concurrency, total // 10, warm_requests)
    await run_load(url, maker(f"w{tag}-"), concurrency=concurrency, total_requests=warm)
    return await measured(
        pid, run_load(url, maker(f"{tag}-"), concurrency=concurrency, total_requests=total, check=check)
    )


def row(
    name: str,
    concurrency: int,
    calls: int,
    result: LoadResult,
    per_request_calls: int = 1,
    server_cpu_s: float | None = None,
) -> dict:
    return {
        "server_cpu_us": None if server_cpu_s is None else server_cpu_s / calls * 1e6,
        "path": name,
        "callers": concurrency,
        "calls_per_s": calls / result.wall_s,
        "p50_ms": percentile(result.latencies, 0.50) * 1000,
        "p99_ms": percentile(result.latencies, 0.99) * 1000,
        "errors": result.errors,
        "calls": calls,
        "per_request": per_request_calls,
    }


async def bench_in_process(concurrency: int, total: int) -> dict:
    from tool_server.app import build_registry
    from tool_server.executor.executor import Executor

    config = config_from_dict(server_config(), environ={})
    executor = Executor(build_registry(config), config)
    await executor.start()
    result = LoadResult()
    counter = iter(range(total))

    async def caller() -> None:
        for i in counter:
            start = time.perf_counter()
            r = await executor.run_one(Call(f"c{i}", "echo", {"text": "hi"}))
            result.latencies.append(time.perf_counter() - start)
            result.errors += r.is_error
            result.requests += 1
            if i % 64 == 0:
                await asyncio.sleep(0)  # let other callers interleave, as a server would

    start, cpu = time.perf_counter(), cpu_seconds(None)
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    result.wall_s, cpu = time.perf_counter() - start, cpu_seconds(None) - cpu
    await executor.stop()
    return row("(a) executor in-process", concurrency, total, result, 1, cpu)


def batch_maker(url: str, size: int, prefix: str):
    def make(i: int) -> bytes:
        calls = [
            {"call_id": f"{prefix}{i}-{j}", "name": "echo", "arguments": {"text": "hi"}} for j in range(size)
        ]
        return build_post(url, orjson.dumps({"calls": calls}))

    return make


def mcp_maker(url: str, sessions: int = 0):
    """MCP tools/call POSTs of echo; with ``sessions``, each carries one of that many
    ``X-Toolfactory-Session`` headers (what a session-hashing proxy routes on)."""

    def make(i: int) -> bytes:
        body = {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": MCP_META},
        }
        headers = dict(MCP_HEADERS)
        if sessions:
            headers["X-Toolfactory-Session"] = f"bench-{i % sessions}"
        return build_post(url, orjson.dumps(body), headers)

    return make


def ok_batch(status: int, body: bytes) -> bool:
    return not any(r["is_error"] for r in orjson.loads(body)["results"])


def ok_mcp(status: int, body: bytes) -> bool:
    data = orjson.loads(body)
    return "result" in data and not data["result"].get("isError")


async def bench_official_client(url: str, concurrency: int, total: int) -> dict:
    from mcp import Client

    result = LoadResult()
    per_client = max(1, total // concurrency)

    async def caller() -> None:
        async with Client(url, mode="2026-07-28") as client:
            for _ in range(per_client):
                start = time.perf_counter()
                try:
                    r = await client.call_tool("echo", {"text": "hi"})
                    result.errors += bool(r.is_error)
                except Exception:
                    result.errors += 1
                result.latencies.append(time.perf_counter() - start)
                result.requests += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - start
    return row("(e) official MCP client", concurrency, per_client * concurrency, result)


def best_of(runs: list[dict]) -> dict:
    """The fastest of repeated runs, with the range of all of them.

    This machine's neighbours only ever slow a run down (the same script has moved
    20-30 % between runs minutes apart), so the fastest run is the best estimate of what
    the code costs; the range shows how much the machine moved meanwhile.
    """
    best = max(runs, key=lambda r: r["calls_per_s"])
    rates = [r["calls_per_s"] for r in runs]
    return {**best, "range": (min(rates), max(rates)), "runs": len(runs)}


async def run_all(
    server_url: str, baseline_url: str, quick: bool, repeats: int, server_pid: int, baseline_pid: int
) -> list[dict]:
    scale = 0.2 if quick else 1.0
    idempotency_entries = config_from_dict(server_config(), environ={}).idempotency.max_entries
    batch_url, mcp_url, sdk_url = server_url + "/v1/calls", server_url + "/mcp/test", baseline_url + "/mcp"
    rows = []
    for concurrency in (32, 1024):

        def n(base: int, concurrency: int = concurrency) -> int:
            return max(concurrency, int(base * scale))

        rows.append(await bench_in_process(concurrency, n(200_000)))
        # (name, server pid, url, request maker, id tag, requests, check, calls per request,
        # warm-up requests before the first run). Steady state for the batched path: a server
        # that has run a few seconds at this rate holds as many results for retries as its
        # idempotency store keeps (until then it grows, and pays page faults for it).
        paths = [
            ("(b) /v1/calls, 64 per POST", server_pid, batch_url, lambda t: batch_maker(batch_url, 64, t),
             f"b{concurrency}", n(3000), ok_batch, 64, math.ceil(idempotency_entries / 64)),
            ("(c) /v1/calls, 1 per POST", server_pid, batch_url, lambda t: batch_maker(batch_url, 1, t),
             f"s{concurrency}", n(20_000), ok_batch, 1, 0),
            ("(d) MCP 2026-07-28 raw POST (ours)", server_pid, mcp_url, lambda t: mcp_maker(mcp_url),
             "m", n(8000), ok_mcp, 1, 0),
            ("(d0) MCP SDK low-level server (baseline)", baseline_pid, sdk_url, lambda t: mcp_maker(sdk_url),
             "m", n(8000), ok_mcp, 1, 0),
        ]  # fmt: skip
        runs: dict[str, list[dict]] = {name: [] for name, *_ in paths}
        for rep in range(repeats):  # interleaved, so that ours and the SDK's see the same machine
            for name, pid, url, maker, tag, total, check, per_request, warm in paths:
                r, cpu = await warm_then_measure(
                    pid, url, maker, f"{tag}r{rep}", concurrency, total, check, warm if rep == 0 else 0
                )
                runs[name].append(row(name, concurrency, r.requests * per_request, r, per_request, cpu))
        rows += [best_of(runs[name]) for name, *_ in paths]
        rows.append(await bench_official_client(mcp_url, concurrency, n(2048)))
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "| path | callers | calls/s | p50 ms | p99 ms | errors | × MCP (d) | server CPU µs/call | all runs, calls/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mcp = next(x for x in rows if x["path"].startswith("(d) ") and x["callers"] == r["callers"])
        cpu = "" if r.get("server_cpu_us") is None else f"{r['server_cpu_us']:.1f}"
        spread = f"{r['range'][0]:,.0f}–{r['range'][1]:,.0f} ({r['runs']})" if r.get("runs", 1) > 1 else ""
        lines.append(
            f"| {r['path']} | {r['callers']} | {r['calls_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['errors']} | {r['calls_per_s'] / mcp['calls_per_s']:.1f}× | {cpu} | {spread} |"
        )
    for c in sorted({r["callers"] for r in rows}):
        ours = next(x for x in rows if x["path"].startswith("(d) ") and x["callers"] == c)
        base = next(x for x in rows if x["path"].startswith("(d0)") and x["callers"] == c)
        batch = next(x for x in rows if x["path"].startswith("(b)") and x["callers"] == c)
        lines.append(
            f"\n{c} callers: batched/MCP = {batch['calls_per_s'] / ours['calls_per_s']:.1f}×; "
            f"SDK baseline/ours on MCP = {base['calls_per_s'] / ours['calls_per_s']:.2f}× (target ≤ 1.2×); "
            f"server CPU per MCP call ours/SDK = {ours['server_cpu_us'] / base['server_cpu_us']:.2f}×"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a fifth of the requests (a smoke run)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each HTTP path, interleaved; the table shows the fastest and the range (default 3)",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    port = free_port()
    baseline = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("sdk_baseline_server.py")), str(port)]
    )
    try:
        with running_server(server_config()) as server:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.1)
            rows = asyncio.run(
                run_all(
                    server.url,
                    f"http://127.0.0.1:{port}",
                    args.quick,
                    args.repeats,
                    server.proc.pid,
                    baseline.pid,
                )
            )
    finally:
        baseline.terminate()
        baseline.wait(10)
    print(
        f"\nserver throughput — {os.cpu_count()} cores, one uvicorn worker per server; "
        f"HTTP paths: fastest of {args.repeats} interleaved runs\n"
    )
    print(render(rows))


if __name__ == "__main__":
    main()
