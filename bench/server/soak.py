"""Soak: mixed traffic against a real server for minutes; do its resources stay flat?

Starts ``tool-server serve`` with the built-in tools (calculator, search over the built-in
corpus, the sandboxed python tool, sql) plus the ``echo`` test tool, and drives, all at
once until the time is up:

* batched ``/v1/calls`` (calculator, echo, search), a few callers back to back;
* MCP calls through the official client, reconnecting every so often;
* python sessions: create, a few calls that build on each other, release (one in twenty is
  abandoned instead and left to the session TTL);
* bad requests: malformed JSON, unknown tools, bad arguments, releasing unknown sessions, requests
  whose headers or body never finish (the header and body timeouts), excess batches.

Every few seconds it samples the server process's RSS, open fds, threads and descendant
processes. After a warm-up it fits a least-squares line to each and prints the slope per
minute, flagging any that is not flat. Exit status 1 if anything is flagged or a request
got an answer it should not have.

    python bench/server/soak.py [--minutes 5] [--quick] [--warmup-s 60] [--sample-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.server import running_server  # noqa: E402

WORDS = [
    "compiler",
    "turing",
    "machine",
    "ada",
    "lovelace",
    "grace",
    "hopper",
    "history",
    "language",
    "algorithm",
    "network",
    "protocol",
    "river",
    "mountain",
    "city",
    "music",
    "painting",
    "physics",
    "energy",
    "planet",
    "ocean",
    "war",
    "treaty",
    "election",
    "economy",
]

# What "flat" allows, per minute after the warm-up: allocator noise, not leaks. A metric is
# flagged when its slope exceeds this by more than three standard errors (sessions come and
# go, so fds and children move; a longer run narrows the error).
FLAT_PER_MINUTE = {"rss_mb": 1.0, "fds": 0.5, "threads": 0.5, "children": 0.5}


def soak_config() -> dict[str, Any]:
    """Built-in tools plus echo; stores small enough to reach their steady state in the warm-up."""
    return {
        "extends": "builtin",
        "server": {"shutdown_grace_s": 5, "header_timeout_s": 5, "body_timeout_s": 5},
        "tools": [
            {"target": "tools.calculator:calculator", "toolsets": ["default"]},
            {"target": "tools.search:SearchTool", "toolsets": ["default"]},
            {"target": "tools.python_tool:PythonTool", "toolsets": ["default"], "args": {"pool_size": 4}},
            {"target": "tools.sql:SqlTool", "toolsets": ["default"]},
            {"target": "tools.testing:echo", "toolsets": ["default"]},
        ],
        # A results store that only fills after 15 minutes would look like a leak.
        "idempotency": {"ttl_s": 30, "max_entries": 20_000},
        "cache": {"ttl_s": 30, "max_entries": 5_000},
        "sessions": {"ttl_s": 10, "sweep_interval_s": 1},
    }


# -- resource sampling ------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds since the start of the traffic
    rss_mb: float
    fds: int
    threads: int
    children: int


def descendants(pid: int) -> int:
    """Processes below ``pid`` (sandbox workers and whatever they started)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    count, todo = 0, [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        count += len(children)
        todo += children
    return count


def sample(pid: int, t: float) -> Sample:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return Sample(
        t=t,
        rss_mb=int(status["VmRSS"].split()[0]) / 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"]),
        children=descendants(pid),
    )


def slope_per_minute(ts: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares slope and its standard error, in units per minute."""
    mean_t, mean_v = statistics.fmean(ts), statistics.fmean(values)
    var = sum((t - mean_t) ** 2 for t in ts)
    if var == 0 or len(ts) < 3:
        return 0.0, 0.0
    slope = sum((t - mean_t) * (v - mean_v) for t, v in zip(ts, values, strict=True)) / var
    residuals = sum((v - mean_v - slope * (t - mean_t)) ** 2 for t, v in zip(ts, values, strict=True))
    return 60 * slope, 60 * math.sqrt(residuals / (len(ts) - 2) / var)


# -- traffic ------------------------------------------------------------------------------


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)

    def ok(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n

    def bad(self, kind: str, what: str) -> None:
        self.counts[kind + " unexpected"] += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(f"{kind}: {what}")


def call(name: str, arguments: dict[str, Any], session: str | None = None) -> dict[str, Any]:
    item = {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}
    return item | ({"session": session} if session else {})


def mixed_call(rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.5:
        return call("calculator", {"expression": f"{rng.randint(1, 999)} * ({rng.randint(1, 99)} + 7)"})
    if roll < 0.8:
        return call("echo", {"text": " ".join(rng.sample(WORDS, 3))})
    return call("search", {"query": " ".join(rng.sample(WORDS, 2)), "topk": 3})


async def batches(url: str, deadline: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while time.monotonic() < deadline:
            calls = [mixed_call(rng) for _ in range(rng.choice((1, 8, 32, 64)))]
            try:
                response = await client.post("/v1/calls", json={"calls": calls})
                results = response.json()["results"]
                errors = [r for r in results if r.get("is_error")]
                if response.status_code != 200 or errors:
                    tally.bad("batch", f"{response.status_code} {errors[:1]}")
                else:
                    tally.ok("batched calls", len(results))
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                tally.bad("batch", repr(exc))


async def mcp_calls(url: str, deadline: float, tally: Tally, seed: int) -> None:
    from mcp import Client

    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            async with Client(url + "/mcp", mode="2026-07-28") as client:
                for _ in range(50):  # then reconnect: a new client, a new connection
                    if time.monotonic() >= deadline:
                        break
                    item = mixed_call(rng)
                    result = await client.call_tool(item["name"], item["arguments"])
                    if result.is_error:
                        tally.bad("mcp", str(result.content)[:200])
                    else:
                        tally.ok("mcp calls")
        except Exception as exc:  # the client raises many kinds; all count as failures
            tally.bad("mcp", repr(exc))


async def python_sessions(url: str, deadline: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while time.monotonic() < deadline:
            try:
                session = (await client.post("/v1/sessions", json={})).json()["session"]
                n = rng.randint(2, 50)
                steps = [f"xs = list(range({n}))", "total = sum(xs)", "print(total)"]
                for code in steps:
                    response = await client.post(
                        "/v1/calls", json={"calls": [call("python", {"code": code}, session)]}
                    )
                    result = response.json()["results"][0]
                    if result.get("is_error"):
                        tally.bad("python", str(result.get("error")))
                        break
                else:
                    if str(n * (n - 1) // 2) in result["content"][0]["text"]:
                        tally.ok("python sessions")
                    else:
                        tally.bad("python", f"wrong output {result['content']}")
                if rng.random() < 0.05:
                    tally.ok("python sessions abandoned")  # left to the session TTL
                elif (await client.delete(f"/v1/sessions/{session}")).status_code != 200:
                    tally.bad("python", "release failed")
            except (httpx.HTTPError, KeyError, ValueError, IndexError) as exc:
                tally.bad("python", repr(exc))


async def bad_requests(url: str, deadline: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    huge = {"calls": [call("echo", {}) for _ in range(4097)]}  # over max_calls_per_batch
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            kind = rng.choice(["json", "tool", "args", "session", "batch", "headers", "body"])
            try:
                if kind == "headers" or kind == "body":
                    status = await stalled_request(host, int(port), body=kind == "body")
                    expected = {408}
                elif kind == "session":
                    status = (await client.delete(f"/v1/sessions/gone-{uuid.uuid4().hex}")).status_code
                    expected = {404}
                else:
                    response = await client.post("/v1/calls", **bad_payload(kind, huge))
                    status, expected = response.status_code, {400, 413, 200}
                    if status == 200 and not response.json()["results"][0].get("is_error"):
                        status = -1  # a bad call that succeeded
            except (httpx.HTTPError, OSError, ValueError) as exc:
                tally.bad("bad request", f"{kind}: {exc!r}")
                continue
            if status in expected:
                tally.ok(f"bad requests answered ({kind})")
            else:
                tally.bad("bad request", f"{kind}: status {status}")


def bad_payload(kind: str, huge: dict[str, Any]) -> dict[str, Any]:
    if kind == "json":
        return {"content": b'{"calls": [', "headers": {"content-type": "application/json"}}
    if kind == "tool":
        return {"json": {"calls": [call("no_such_tool", {})]}}
    if kind == "args":
        return {"json": {"calls": [call("calculator", {"expr": 1})]}}
    return {"json": huge}


async def stalled_request(host: str, port: int, *, body: bool) -> int:
    """Half a request, then silence: the server must answer 408 and close, not wait forever."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if body:
            head = b"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            writer.write(head + b"Content-Length: 1000\r\n\r\n{")
        else:
            writer.write(b"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        status_line = await asyncio.wait_for(reader.readline(), 30)
        return int(status_line.split()[1]) if status_line else 0
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def drive(url: str, pid: int, seconds: float, sample_s: float) -> tuple[list[Sample], Tally]:
    tally, samples = Tally(), []
    start = time.monotonic()
    deadline = start + seconds
    workers = [
        *(batches(url, deadline, tally, seed) for seed in range(3)),
        *(mcp_calls(url, deadline, tally, 10 + seed) for seed in range(2)),
        *(python_sessions(url, deadline, tally, 20 + seed) for seed in range(2)),
        bad_requests(url, deadline, tally, 30),
    ]

    async def sampler() -> None:
        while time.monotonic() < deadline:
            samples.append(sample(pid, time.monotonic() - start))
            await asyncio.sleep(sample_s)
        samples.append(sample(pid, time.monotonic() - start))

    await asyncio.gather(sampler(), *workers)
    return samples, tally


# -- report -------------------------------------------------------------------------------


def report(samples: list[Sample], tally: Tally, warmup_s: float, seconds: float) -> bool:
    """Print traffic and resource slopes; True when everything is flat and answered as expected."""
    print(f"\ntraffic over {seconds / 60:.1f} min:")
    for kind, count in sorted(tally.counts.items()):
        print(f"  {kind:40s} {count:10,d}  ({count / seconds:,.1f}/s)")
    for line in tally.unexpected:
        print(f"  UNEXPECTED {line}")
    steady = [s for s in samples if s.t >= warmup_s]
    if len(steady) < 3:
        print(f"too few samples after the {warmup_s:g} s warm-up to fit a slope")
        return False
    print(
        f"\nserver resources: {len(steady)} samples from {steady[0].t:.0f} s to {steady[-1].t:.0f} s "
        f"(warm-up {warmup_s:g} s excluded; first sample: {samples[0].rss_mb:.0f} MB RSS, "
        f"{samples[0].fds} fds, {samples[0].threads} threads, {samples[0].children} children)"
    )
    print(
        f"  {'metric':10s} {'min':>8s} {'max':>8s} {'last':>8s} {'slope/min':>10s} {'± s.e.':>8s} {'limit':>6s}"
    )
    flat = True
    ts = [s.t for s in steady]
    for metric, limit in FLAT_PER_MINUTE.items():
        values = [float(getattr(s, metric)) for s in steady]
        slope, error = slope_per_minute(ts, values)
        ok = slope - 3 * error < limit
        flat = flat and ok
        print(
            f"  {metric:10s} {min(values):8.1f} {max(values):8.1f} {values[-1]:8.1f} "
            f"{slope:+10.3f} {error:8.3f} {limit:6.1f}  {'flat' if ok else 'NOT FLAT'}"
        )
    return flat and not tally.unexpected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="traffic duration (default 5)")
    parser.add_argument("--quick", action="store_true", help="one minute, 20 s warm-up (a smoke run)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="samples before this are not fitted")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    args = parser.parse_args(argv)
    seconds = 60.0 if args.quick else args.minutes * 60
    warmup_s = 20.0 if args.quick else args.warmup_s
    sample_s = 2.0 if args.quick else args.sample_s
    with running_server(soak_config()) as server:
        print(
            f"server pid {server.proc.pid} at {server.url}; {seconds / 60:g} min of traffic, sampling every {sample_s:g} s"
        )
        samples, tally = asyncio.run(drive(server.url, server.proc.pid, seconds, sample_s))
        crashed = server.proc.poll() is not None
    ok = report(samples, tally, warmup_s, seconds) and not crashed
    print("\nresult:", "flat, every request answered as expected" if ok else "FLAGGED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
