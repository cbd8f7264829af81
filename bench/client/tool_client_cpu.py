"""The ToolClient's own CPU per call when its replica is slow: this tree against a git ref.

One replica (``tool-server serve``), then client processes, one at a time, alternating
between this tree's ``trainer_client`` and ``git archive REF``'s (sides swap order each
round). Each runs closed-loop simulated trajectories (a call, then an exponential think
time) through one ``ToolClient`` and measures, over its window after a warm-up, its own
CPU (``time.process_time``) and the replica's (``/proc``), per call answered. Scenarios:

* ``slow``: every call sleeps 100 ms (a replica slow as a whole: every batch is late);
* ``queued``: the replica runs 16 calls at a time, each sleeps 10 ms, and ~4x that is
  offered (an overloaded replica: calls queue for its slots);
* ``busy``: calculator calls as fast as the client can send them (the client's CPU is the
  limit; big batches);
* ``held``: calculator calls, and one in 50 sleeps 300 ms (one call holds a batch back:
  where split POSTs are meant to help; compare the p50 latency).

Prints per scenario and side: calls/s, p50 latency, calls per POST, split POSTs per call,
client and server CPU µs per call, and the ratios tree/ref. Figures in bench/README.md.

``--callers 8,32,1024`` measures instead the client's CPU per call when it is the limit: that
many callers, each awaiting one echo call at a time (no think time), until ``--calls`` calls
are answered (after ``--calls / 10`` of warm-up), at the client's default batching and at
``max_batch=64``; in two places:

* ``processes``: the client process against a real replica (``tool-server serve``);
* ``in-process``: the client against a stub HTTP server on loopback in the client's own
  process and event loop, which answers a POST of N calls with a prebuilt body of N echo
  results (the client reads results in order, not by id), so nearly all of the process's
  CPU is the client's: no server, no other process, no loopback wake-ups of a second
  process (the ``raw`` row is ``loadgen`` against the same stub).

Each gets a ``raw`` row too: ``bench/loadgen.py`` sending the same calls (fresh call ids,
one orjson body per POST, ``min(callers, max_batch)`` calls per POST), the floor for any
client. CPU is ``time.process_time`` of the client process per call answered.

    .venv/bin/python bench/client/tool_client_cpu.py --ref 30cbc3e [--rounds 2 --seconds 6]   # ~3 min
    .venv/bin/python bench/client/tool_client_cpu.py --ref 30cbc3e --quick                    # ~1 min
    .venv/bin/python bench/client/tool_client_cpu.py --ref HEAD --callers 8,32,1024 --calls 40000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")

# name -> (trajectories, mean think time in ms, the replica's max_concurrency)
SCENARIOS: dict[str, tuple[int, float, int]] = {
    "slow": (64, 10.0, 4096),
    "queued": (128, 10.0, 16),
    "busy": (256, 10.0, 4096),
    "held": (64, 20.0, 4096),
}


def scenario_call(name: str, rng: random.Random, k: int) -> tuple[str, dict[str, Any]]:
    if name == "slow":
        return "sleep", {"seconds": 0.1}
    if name == "queued":
        return "sleep", {"seconds": 0.01}
    if name == "held" and rng.random() < 1 / 50:
        return "sleep", {"seconds": 0.3}
    return "calculator", {"expression": f"{k} * 7 + {rng.randrange(10**6)}"}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def client_main(args: argparse.Namespace) -> None:
    """One client process, importing ``trainer_client`` and ``protocol`` from the tree ``--client`` names."""
    sys.path.insert(0, args.client)
    from protocol import Call, new_call_id  # noqa: PLC0415 (from the side's tree)
    from trainer_client.client.tool_client import ToolClient  # noqa: PLC0415

    trajectories, think_ms, _ = SCENARIOS[args.scenario]
    rng = random.Random(0)
    begin = time.monotonic()
    measure_from, stop_at = begin + args.warmup, begin + args.warmup + args.seconds
    latencies: list[float] = []
    errors = 0
    marks: list[tuple[float, float]] = []

    async with ToolClient(args.url) as client:

        async def trajectory(k: int) -> None:
            nonlocal errors
            while time.monotonic() < stop_at:
                await asyncio.sleep(rng.expovariate(1000 / think_ms))
                tool, arguments = scenario_call(args.scenario, rng, k)
                t0 = time.monotonic()
                (result,) = await client.call_tools([Call(new_call_id(), tool, arguments)])
                t1 = time.monotonic()
                if measure_from <= t1 < stop_at:
                    latencies.append(t1 - t0)
                    errors += result.is_error

        async def clock() -> None:
            for at in (measure_from, stop_at):
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                marks.append((time.process_time(), cpu_s(args.server_pid)))

        tasks = [asyncio.ensure_future(trajectory(k)) for k in range(trajectories)]
        await clock()
        window = client.metrics()
        await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    calls = len(latencies)
    out = {
        "calls": calls,
        "errors": errors,
        "calls_per_s": calls / args.seconds,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "client_us": (marks[1][0] - marks[0][0]) / max(1, calls) * 1e6,
        "server_us": (marks[1][1] - marks[0][1]) / max(1, calls) * 1e6,
        # over the whole run (the warm-up included): how the batches looked
        "calls_per_post": window["mean_batch_size"],
        "splits_per_call": window["split_posts"] / max(1, window["calls_sent"]),
    }
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------- callers mode

# (callers, max_batch: 0 = the client's default) -> what each side measured
BATCHINGS = {"default": 0, "64": 64}
WHERE = ("processes", "in-process")
STUB_INSTANCE = b"stub-0001"


class StubServer(asyncio.Protocol):
    """A minimal HTTP/1.1 server for ``in-process`` runs: answers ``/v1/calls`` with as many
    canned echo results as the request has calls (the shape the real server sends; bodies
    built once per size), ``/v1/tools`` with no tools, and anything else with ``{}``;
    keep-alive, as many requests per connection as come."""

    bodies: dict[int, bytes] = {}  # noqa: RUF012 (a cache shared by every connection)

    def __init__(self) -> None:
        import httptools  # noqa: PLC0415 (a dependency of uvicorn[standard] and of the client)

        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._url, self._body = b"", []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:

        if self._url.startswith(b"/v1/calls"):
            count = b"".join(self._body).count(b'"call_id"')
            body = self.bodies.get(count) or self.bodies.setdefault(count, canned_results(count))
        elif self._url.startswith(b"/v1/tools"):
            body = b'{"tools":[]}'
        else:
            body = b"{}"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-toolfactory-instance: %s\r\n" % (
            STUB_INSTANCE
        )
        assert self._transport is not None
        self._transport.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)


def canned_results(count: int) -> bytes:
    import orjson  # noqa: PLC0415

    result = {
        "content": [{"type": "text", "text": '{"text":"hi","data":null}'}],
        "structured": {"text": "hi", "data": None},
        "is_error": False,
        "error": None,
        "elapsed_ms": 0.02,
        "cached": False,
    }
    return orjson.dumps({"results": [{"call_id": f"stub-{i:032x}", **result} for i in range(count)]})


async def start_stub() -> tuple[asyncio.AbstractServer, str]:
    server = await asyncio.get_running_loop().create_server(StubServer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def callers_main(args: argparse.Namespace) -> None:
    """One client process: ``--callers`` closed-loop callers through one ToolClient (or, with
    ``--raw``, through ``bench.loadgen``), ``--calls`` measured after a tenth of that as warm-up."""
    stub = None
    url = args.url
    if url == "stub":
        stub, url = await start_stub()
    calls_total, warmup = args.calls, max(1, args.calls // 10)
    if args.raw:
        out = await raw_calls(url, args.callers, args.max_batch or 256, warmup, calls_total)
    else:
        sys.path.insert(0, args.client)
        from protocol import Call, new_call_id  # noqa: PLC0415 (from the side's tree)
        from trainer_client.client.tool_client import ToolClient  # noqa: PLC0415

        try:  # as `trainer-client rollout`/`train` do once the model and clients are loaded
            from trainer_client.gc_tuning import freeze_startup_heap  # noqa: PLC0415
        except ImportError:  # a ref from before the trainer froze its start-up heap
            freeze_startup_heap = None
        options: dict[str, Any] = {"max_batch": args.max_batch} if args.max_batch else {}
        latencies: list[float] = []
        errors = 0

        async def phase(client: Any, total: int, keep: bool) -> None:
            counter = iter(range(total))

            async def caller() -> None:
                nonlocal errors
                for _ in counter:
                    t0 = time.perf_counter()
                    (result,) = await client.call_tools([Call(new_call_id(), "echo", {"text": "hi"})])
                    if keep:
                        latencies.append(time.perf_counter() - t0)
                        errors += result.is_error

            await asyncio.gather(*(caller() for _ in range(args.callers)))

        async with ToolClient(url, **options) as client:
            if freeze_startup_heap is not None:
                freeze_startup_heap()
            await phase(client, warmup, keep=False)
            before, server_before = client.metrics(), server_cpu(args.server_pid)
            cpu0 = time.process_time()
            await phase(client, calls_total, keep=True)
            cpu = time.process_time() - cpu0
            after, server_after = client.metrics(), server_cpu(args.server_pid)
        calls = len(latencies)
        # The callers' own work (a Call, its id, its arguments, the timing) through a client
        # that answers at once: part of the figure above, the same for any client.
        cpu0 = time.process_time()
        await phase(NullClient(), calls_total, keep=False)
        harness = time.process_time() - cpu0
        posts = after["batches"] - before["batches"]
        out = {
            "calls": calls,
            "errors": errors,
            "client_us": cpu / max(1, calls) * 1e6,
            "harness_us": harness / max(1, calls_total) * 1e6,
            "server_us": (server_after - server_before) / max(1, calls) * 1e6,
            "calls_per_post": (after["calls_sent"] - before["calls_sent"]) / max(1, posts),
            "split_posts": after["split_posts"] - before["split_posts"],
            "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
        }
    if stub is not None:
        stub.close()
    print(json.dumps(out), flush=True)


class NullClient:
    """Answers every call at once with one canned result (the callers' own cost, measured)."""

    def __init__(self) -> None:
        self._answer = [argparse.Namespace(is_error=False)]

    async def call_tools(self, calls: list[Any]) -> list[Any]:
        return self._answer


def server_cpu(pid: int | None) -> float:
    return cpu_s(pid) if pid else 0.0


async def raw_calls(url: str, callers: int, max_batch: int, warmup: int, total: int) -> dict[str, Any]:
    """The floor: ``loadgen`` POSTs of ``min(callers, max_batch)`` echo calls, fresh ids and one
    orjson body each, on ``ceil(callers / size)`` keep-alive connections."""
    import orjson  # noqa: PLC0415

    sys.path.insert(0, str(REPO))
    from bench.loadgen import build_post, run_load  # noqa: PLC0415

    size = min(callers, max_batch)
    ids = itertools.count()

    def make(_: int) -> bytes:
        calls = [
            {"call_id": f"raw-{next(ids)}", "name": "echo", "arguments": {"text": "hi"}} for _ in range(size)
        ]
        return build_post(url + "/v1/calls", orjson.dumps({"calls": calls}))

    connections = math.ceil(callers / size)
    await run_load(url, make, concurrency=connections, total_requests=max(1, warmup // size))
    requests = max(1, total // size)
    cpu0 = time.process_time()
    result = await run_load(url, make, concurrency=connections, total_requests=requests)
    cpu = time.process_time() - cpu0
    return {
        "calls": result.requests * size,
        "errors": result.errors,
        "client_us": cpu / max(1, result.requests * size) * 1e6,
        "harness_us": 0.0,
        "server_us": 0.0,
        "calls_per_post": float(size),
        "split_posts": 0,
        "p50_ms": percentile(result.latencies, 0.5) * 1000,
        "p99_ms": percentile(result.latencies, 0.99) * 1000,
    }


def run_callers_side(
    tree: str | None, where: str, callers: int, max_batch: int, url: str, pid: int | None, calls: int
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--callers-run", str(callers), "--max-batch", str(max_batch)]
    command += ["--calls", str(calls), "--url", url if where == "processes" else "stub"]
    command += ["--client", tree] if tree else ["--raw"]
    if where == "processes" and pid:
        command += ["--server-pid", str(pid)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the client {command[3:]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def callers_bench(args: argparse.Namespace, sides: dict[str, str]) -> None:
    """Every (where, batching, callers) with tree, ref and raw interleaved, ``--rounds`` times."""
    grid = [
        (where, batching, callers)
        for where in args.where.split(",")
        for batching in args.batching.split(",")
        for callers in (int(c) for c in args.callers.split(","))
    ]
    results: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    loads = [os.getloadavg()[0]]
    with running_server_for_bench() as server:
        for round_ in range(args.rounds):
            for where, batching, callers in grid:
                order = ["tree", "ref", "raw"] if round_ % 2 == 0 else ["ref", "tree", "raw"]
                for side in order:
                    run = run_callers_side(
                        sides.get(side),
                        where,
                        callers,
                        BATCHINGS[batching],
                        server.url,
                        server.proc.pid,
                        args.calls,
                    )
                    results.setdefault((where, batching, callers, side), []).append(run)
                    loads.append(os.getloadavg()[0])
    print(
        f"ToolClient CPU per call when the client is the limit, this tree against {args.ref}: "
        f"{args.rounds} run(s) of {args.calls:,} calls per side and row; "
        f"load average {min(loads):.1f}-{max(loads):.1f} (1 min)"
    )
    print(
        "| where | batching | callers | side | client µs/call (range) | callers' own | calls/POST "
        "| split POSTs | p50 | p99 | server µs/call |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for where, batching, callers in grid:
        for side in ("tree", "ref", "raw"):
            runs = results[(where, batching, callers, side)]
            server = f"{mean(runs, 'server_us'):,.1f}" if where == "processes" and side != "raw" else ""
            own = f"{mean(runs, 'harness_us'):,.1f}" if side != "raw" else ""
            print(
                f"| {where} | {batching} | {callers} | {side} | {mean(runs, 'client_us'):,.1f} "
                f"({min(r['client_us'] for r in runs):,.1f}-{max(r['client_us'] for r in runs):,.1f}) "
                f"| {own} | {mean(runs, 'calls_per_post'):.1f} | {sum(r['split_posts'] for r in runs)} "
                f"| {mean(runs, 'p50_ms'):.1f} ms | {mean(runs, 'p99_ms'):.1f} ms | {server} |"
            )
        tree, ref = results[(where, batching, callers, "tree")], results[(where, batching, callers, "ref")]
        gross = mean(tree, "client_us") / mean(ref, "client_us")
        net = (mean(tree, "client_us") - mean(tree, "harness_us")) / (
            mean(ref, "client_us") - mean(ref, "harness_us")
        )
        print(f"|  |  |  | tree/ref | **{gross:.2f}x** | less callers' own: {net:.2f}x | | | | | |")
        errors = {
            s: sum(r["errors"] for r in results[(where, batching, callers, s)])
            for s in ("tree", "ref", "raw")
        }
        if any(errors.values()):
            print(f"|  |  |  | errors: {errors} | | | | | | |")


def running_server_for_bench() -> Any:
    from tests.support.server import running_server, server_config  # noqa: PLC0415

    return running_server(server_config(limits={"max_concurrency": 4096}))


def run_side(tree: str, scenario: str, url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--client", tree, "--scenario", scenario, "--url", url]
    command += ["--server-pid", str(pid), "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the {scenario} client from {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mean(runs: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="the git ref to compare with (e.g. before a change)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per side and scenario")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="one round of 4 s per side and scenario")
    parser.add_argument("--callers", help="measure at these caller counts instead, e.g. 8,32,1024")
    parser.add_argument("--calls", type=int, default=40_000, help="calls measured per run (--callers)")
    parser.add_argument("--batching", default=",".join(BATCHINGS), help="default,64 (--callers)")
    parser.add_argument("--where", default=",".join(WHERE), help="processes,in-process (--callers)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # a client process: its tree
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--callers-run", type=int, help=argparse.SUPPRESS)  # a callers-mode client
    parser.add_argument("--max-batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callers_run:
        args.callers = args.callers_run
        asyncio.run(callers_main(args))
        return
    if args.client:
        asyncio.run(client_main(args))
        return
    if not args.ref:
        parser.error("--ref is required")
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 4.0, 1.0
    sys.path.insert(0, str(REPO))
    from bench.git_ref import export_ref  # noqa: PLC0415
    from tests.support.server import running_server, server_config  # noqa: PLC0415

    sides = {"tree": str(REPO), "ref": export_ref(args.ref, "trainer_client", "protocol")}
    if args.callers:
        try:
            callers_bench(args, sides)
        finally:
            shutil.rmtree(sides["ref"], ignore_errors=True)
        return
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    loads = [os.getloadavg()[0]]
    try:
        for scenario in args.scenarios.split(","):
            limits = {"max_concurrency": SCENARIOS[scenario][2]}
            with running_server(server_config(limits=limits)) as server:
                for round_ in range(args.rounds):
                    for side in list(sides) if round_ % 2 == 0 else list(sides)[::-1]:
                        run = run_side(sides[side], scenario, server.url, server.proc.pid, args)
                        results.setdefault((scenario, side), []).append(run)
                        loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(sides["ref"], ignore_errors=True)
    print(
        f"ToolClient CPU per call, this tree against {args.ref}: {args.rounds} run(s) of {args.seconds:g} s "
        f"per side and scenario; load average {min(loads):.1f}-{max(loads):.1f} (1 min)"
    )
    print(
        "| scenario | side | calls/s | p50 | calls/POST | split POSTs/call | client µs/call | server µs/call |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for scenario in args.scenarios.split(","):
        for side in sides:
            runs = results[(scenario, side)]
            print(
                f"| {scenario} | {side} | {mean(runs, 'calls_per_s'):,.0f} | {mean(runs, 'p50_ms'):.0f} ms "
                f"| {mean(runs, 'calls_per_post'):.1f} | {mean(runs, 'splits_per_call'):.2f} "
                f"| {mean(runs, 'client_us'):,.0f} | {mean(runs, 'server_us'):,.0f} |"
            )
        tree, ref = results[(scenario, "tree")], results[(scenario, "ref")]
        print(
            f"|  | tree/ref | {mean(tree, 'calls_per_s') / mean(ref, 'calls_per_s'):.2f}x "
            f"| {mean(tree, 'p50_ms') / mean(ref, 'p50_ms'):.2f}x | | "
            f"| {mean(tree, 'client_us') / mean(ref, 'client_us'):.2f}x "
            f"| {mean(tree, 'server_us') / mean(ref, 'server_us'):.2f}x |"
        )
        if any(r["errors"] for r in tree + ref):
            print(
                f"|  | errors: tree {sum(r['errors'] for r in tree)}, ref {sum(r['errors'] for r in ref)} |"
            )


if __name__ == "__main__":
    main()
