"""What reaching replicas costs: direct, through nginx (hashing the session header), through DNS.

Three replicas on 127.0.0.2-127.0.0.4 (one uvicorn worker each) and Debian's nginx with the
shipped ``compose/nginx/toolfactory.conf`` in front, side by side in one run:

(a) MCP ``tools/call`` POSTs (2026-07-28, raw, ``bench.loadgen``) straight to the three
    replicas, a third of the callers on each;
(b) the same through nginx without a session header (least_conn over the replicas);
(c) the same through nginx with ``X-Toolfactory-Session`` (one of 1,000 ids per request:
    the consistent hash picks the replica);
(d) ``ToolClient`` (batched ``/v1/calls``) given the three replica URLs, and
(e) the same client given ``dns://NAME:PORT`` (NAME on three /etc/hosts lines; skipped
    where /etc/hosts cannot be written): discovery should cost nothing per call.

Everything shares this machine's cores (replicas, nginx, load generator), so the absolute
figures are low; the ratios against (a) and (d) are the result. Interleaved repeats, the
fastest of each shown with the range.

    python bench/capacity/replicas.py [--quick] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.loadgen import LoadResult, percentile, run_load  # noqa: E402
from bench.server.server_throughput import mcp_maker  # noqa: E402
from protocol import Call, new_call_id  # noqa: E402
from tests.chaos.test_discovery import HostsEntries, common_port  # noqa: E402
from tests.chaos.test_nginx import running_nginx  # noqa: E402
from tests.support.server import running_server, server_config  # noqa: E402
from trainer_client.client.tool_client import ToolClient  # noqa: E402

ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
CONFIG = server_config(mcp={"allowed_hosts": [f"{a}:*" for a in ADDRESSES]})


def ok_mcp(status: int, body: bytes) -> bool:
    data = orjson.loads(body)
    return "result" in data and not data["result"].get("isError")


def row(path: str, calls: int, result: LoadResult) -> dict:
    return {
        "path": path,
        "calls_per_s": calls / result.wall_s,
        "p50_ms": percentile(result.latencies, 0.50) * 1000,
        "p99_ms": percentile(result.latencies, 0.99) * 1000,
        "errors": result.errors,
    }


async def mcp_load(urls: list[str], sessions: int, concurrency: int, total: int, path: str) -> dict:
    """``concurrency`` callers split evenly over ``urls``; one merged result."""
    share = total // len(urls)
    start = time.perf_counter()
    parts = await asyncio.gather(
        *(
            run_load(
                url,
                mcp_maker(url + "/mcp/test", sessions),  # echo is in toolset "test"
                concurrency=max(1, concurrency // len(urls)),
                total_requests=share,
                check=ok_mcp,
            )
            for url in urls
        )
    )
    merged = LoadResult(wall_s=time.perf_counter() - start)
    for part in parts:
        merged.requests += part.requests
        merged.errors += part.errors
        merged.latencies += part.latencies
    return row(path, share * len(urls), merged)


async def client_load(target: str | list[str], concurrency: int, total: int, path: str) -> dict:
    """``concurrency`` callers each awaiting one echo call at a time through one ToolClient."""
    result = LoadResult()
    counter = iter(range(total))
    async with ToolClient(target) as client:
        await client.call_tools([Call(new_call_id(), "echo", {"text": "warm"}) for _ in range(256)])

        async def caller() -> None:
            for _ in counter:
                begin = time.perf_counter()
                (answer,) = await client.call_tools([Call(new_call_id(), "echo", {"text": "hi"})])
                result.latencies.append(time.perf_counter() - begin)
                result.errors += answer.is_error
                result.requests += 1

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return row(path, total, result)


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def best_of(runs: list[dict]) -> dict:
    best = max(runs, key=lambda r: r["calls_per_s"])
    rates = [r["calls_per_s"] for r in runs]
    return {**best, "range": f"{min(rates):,.0f}-{max(rates):,.0f}", "errors": sum(r["errors"] for r in runs)}


def print_table(rows: list[dict]) -> None:
    print("| path | calls/s (best) | range | vs direct | p50 ms | p99 ms | errors |")
    print("|---|---:|---|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    for r in rows:
        family = "client" if "ToolClient" in r["path"] else "mcp"
        base.setdefault(family, r["calls_per_s"])
        ratio = r["calls_per_s"] / base[family]
        print(
            f"| {r['path']} | {r['calls_per_s']:,.0f} | {r['range']} | {ratio:.2f}x | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} |"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small loads, one repeat (a smoke run)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    mcp_total, client_total, repeats = (3_000, 6_000, 1) if args.quick else (12_000, 30_000, args.repeats)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop servers, restore /etc/hosts
    port = common_port(ADDRESSES)
    note(f"starting 3 replicas on port {port}")
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(running_server(CONFIG, host=a, extra_args=["--port", str(port)]))
            for a in ADDRESSES
        ]
        direct = [r.url for r in replicas]
        note("replicas up; starting nginx")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        nginx = stack.enter_context(running_nginx([u.removeprefix("http://") for u in direct], tmp))
        hosts = HostsEntries(f"bench-{uuid.uuid4().hex[:8]}.replicas.test")
        stack.callback(hosts.clear)
        try:
            for address in ADDRESSES:
                hosts.add(address)
            dns: str | None = f"dns://{hosts.name}:{port}"
        except OSError as exc:
            print(f"(e) skipped: cannot write /etc/hosts ({exc})")
            dns = None
        loads = [
            ("(a) MCP POSTs, direct to 3 replicas", lambda: mcp_load(direct, 0, 96, mcp_total, "(a)")),
            (
                "(b) MCP POSTs via nginx, no session header",
                lambda: mcp_load([nginx], 0, 96, mcp_total, "(b)"),
            ),
            (
                "(c) MCP POSTs via nginx, session header hashed",
                lambda: mcp_load([nginx], 1000, 96, mcp_total, "(c)"),
            ),
            ("(d) ToolClient, 3 replica URLs", lambda: client_load(direct, 1024, client_total, "(d)")),
        ]
        if dns is not None:
            loads.append(
                ("(e) ToolClient, dns://NAME:PORT", lambda: client_load(dns, 1024, client_total, "(e)"))
            )
        runs: dict[str, list[dict]] = {name: [] for name, _ in loads}
        for _ in range(repeats):
            for name, load in loads:
                runs[name].append({**await load(), "path": name})
                note(
                    f"{name}: {runs[name][-1]['calls_per_s']:,.0f} calls/s, {runs[name][-1]['errors']} errors"
                )
    print(f"3 replicas + nginx + load generator on one machine; {repeats} interleaved repeat(s)\n")
    print_table([best_of(r) for r in runs.values()])


if __name__ == "__main__":
    asyncio.run(main())
