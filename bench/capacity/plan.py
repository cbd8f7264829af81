"""Capacity plan, measured: per-replica figures, the model's answer, and a loopback simulation.

Three parts in one run (figures in bench/README.md, the plan in docs/scaling.md):

(a) **measure** one replica (``tool-server serve``) serving ``calculator`` (stateless, in
    process), ``search`` (BM25, a worker thread per call), a procedural bank pack
    (``tools.envs.procedural:pack``, a stateful environment: one copy-on-write world per
    session) and the ``python`` sandbox tool. Every call sent is new (a fresh call_id and
    arguments: never an idempotent replay or a cache hit). Server CPU per POST of 1, 8
    and 64 calls of each kind, fitted as a fixed cost per POST plus a cost per call; the
    extra cost of a POST that finds the replica asleep (paced requests); a session
    release (DELETE); a re-sent call_id; a session's start; the ``ToolClient``'s own CPU
    per POST and per call; the replica's RSS and the memory of a live session (RSS growth
    over ``--env-sessions`` environment sessions; PSS of ``--py-sessions`` sandbox
    workers); python's warm call (server + worker) and session start.
(b) **model**: ``bench/capacity/model.py`` with those figures answers "how many replicas
    for N trajectories" for a search-heavy, an environment and a sandbox-heavy mix.
(c) **simulate** at reduced scale: ``--replicas`` servers on 127.0.0.2.. and
    ``--clients`` client processes, each running many simulated trajectories through the
    real ``ToolClient`` (a call, then an exponential think time, ``--calls-per-traj``
    calls per trajectory, a session release, then a new session). The offered load
    (trajectories / think time) is stepped through ``--loads`` times the model's
    prediction for the box (replicas and clients on its cores); reported: achieved
    calls/s, latency, errors, the batch size and split POSTs the clients sent, server and
    client CPU per call against the model's at that batch size and split share.

    .venv/bin/python bench/capacity/plan.py [--quick] [--skip-python] [--loads 0.1,0.5,1,1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.capacity.model import ClientCost, ReplicaSpec, ToolKind, Workload, calls_per_post, plan  # noqa: E402
from bench.loadgen import Connection, build_post, percentile, run_load  # noqa: E402
from tests.chaos.test_discovery import common_port  # noqa: E402
from tests.support.server import running_server, server_config  # noqa: E402
from tools.envs.procedural import pack  # noqa: E402

PACK_ARGUMENTS = {"world": "bank", "seed": 0, "tasks": 20}
TICK = os.sysconf("SC_CLK_TCK")
WORDS = [
    "history",
    "river",
    "empire",
    "music",
    "science",
    "war",
    "king",
    "city",
    "theory",
    "language",
    "art",
    "church",
    "ocean",
    "energy",
]


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------ process figures
def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (sandbox workers hang under the template)."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process tree, live processes only (utime + stime)."""
    total = 0
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def _status_kb(pid: int, key: str, name: str = "status") -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS:") / 1024


def children_pss_mb(pid: int) -> float:
    return sum(_status_kb(p, "Pss:", "smaps_rollup") for p in descendants(pid) if p != pid) / 1024


# --------------------------------------------------------------------------- (a) measure
def replica_config(python: bool, search: bool = False, max_workers: int = 64) -> dict[str, Any]:
    tools: list[dict[str, Any]] = [{"target": "tools.calculator:calculator"}]
    if search:
        tools.append({"target": "tools.search:SearchTool"})
    if python:
        args = {"pool_size": 4, "max_workers": max_workers}
        tools.append({"target": "tools.python_tool:PythonTool", "args": args})
    return server_config(
        tools=tools,
        server={"shutdown_grace_s": 1},
        sessions={"max_sessions": 200_000},  # the measurement opens tens of thousands of sessions
        environments=[{"source": "tools.envs.procedural:pack", "arguments": PACK_ARGUMENTS}],
    )


def accounts() -> list[str]:
    return sorted(pack(**PACK_ARGUMENTS).initial_state["accounts"])


def calls_body(calls: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"calls": calls})


def ok(_status: int, body: bytes) -> bool:
    return not any(r.get("is_error") for r in orjson.loads(body)["results"])


SERIAL = itertools.count()  # every measured call is new: no idempotency replay, no cache hit
BATCHES = (1, 8, 64)


def calc_call(n: int) -> dict:
    return {"call_id": f"c{n}", "name": "calculator", "arguments": {"expression": f"{n} * 3 + 1"}}


def search_call(n: int) -> dict:
    query = f"{WORDS[n % len(WORDS)]} {WORDS[(n // 7) % len(WORDS)]} {n}"
    return {"call_id": f"s{n}", "name": "search", "arguments": {"query": query}}


async def cpu_per_request(
    url: str, pid: int, make: Callable[[int], dict], requests: int, batch: int, concurrency: int = 4
) -> float:
    """Server (tree) CPU µs per POST of ``batch`` calls; ``make(n)`` builds call number ``n``.

    ``n`` is unique over the whole run, and ``make`` puts it in the call_id and the
    arguments: a repeated call_id is answered from the idempotency store (~6 µs, what an
    earlier version of this bench measured by mistake) and repeated arguments of a
    cacheable tool from the result cache.
    """

    def post(_i: int) -> bytes:
        return build_post(url + "/v1/calls", calls_body([make(next(SERIAL)) for _ in range(batch)]))

    return await cpu_of(url, pid, post, max(concurrency, requests), concurrency)


async def cpu_of(
    url: str,
    pid: int,
    request: Callable[[int], bytes],
    requests: int,
    concurrency: int,
    check: Callable[[int, bytes], bool] = ok,
) -> float:
    """Server (tree) CPU µs per request for ``requests`` raw requests built by ``request(i)``."""
    before = tree_cpu_s(pid)
    result = await run_load(url, request, concurrency=concurrency, total_requests=requests, check=check)
    if result.errors:
        raise RuntimeError(f"{result.errors} of {requests} requests failed: {result.statuses}")
    return (tree_cpu_s(pid) - before) / requests * 1e6


async def paced_cpu_per_request(
    url: str, pid: int, make: Callable[[int], dict], conns: int = 4, per_conn: int = 100, gap_s: float = 0.01
) -> float:
    """Server CPU µs per 1-call POST when each connection waits ``gap_s`` between requests,
    so that the replica sleeps between them (as it does at light load)."""
    parts = urlsplit(url)

    async def caller() -> None:
        conn = await Connection.open(parts.hostname or "127.0.0.1", parts.port or 80)
        try:
            for _ in range(per_conn):
                status, body = await conn.request(
                    build_post(url + "/v1/calls", calls_body([make(next(SERIAL))]))
                )
                if not ok(status, body):
                    raise RuntimeError(f"paced request failed: {status} {body[:200]!r}")
                await asyncio.sleep(gap_s)
        finally:
            conn.close()

    before = tree_cpu_s(pid)
    await asyncio.gather(*(caller() for _ in range(conns)))
    return (tree_cpu_s(pid) - before) / (conns * per_conn) * 1e6


def fit_request_cost(per_request: dict[int, float]) -> tuple[float, float]:
    """(fixed, per call) of CPU per request = fixed + per call x batch size.

    Least squares on relative errors (weights 1 / y²): the 64-call POSTs would otherwise
    decide the fixed part alone, which the 1-call POSTs measure best.
    """
    pts = [(x, y, 1 / max(y, 1e-9) ** 2) for x, y in per_request.items()]
    sw = sum(w for _, _, w in pts)
    mx, my = sum(w * x for x, _, w in pts) / sw, sum(w * y for _, y, w in pts) / sw
    slope = sum(w * (x - mx) * (y - my) for x, y, w in pts) / sum(w * (x - mx) ** 2 for x, _, w in pts)
    slope = max(0.0, slope)
    return max(0.0, my - slope * mx), slope


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Part (a): per-request and per-call CPU by kind, session costs and memory on one replica."""
    ids = accounts()
    figures: dict[str, Any] = {}
    with running_server(replica_config(not args.skip_python, search=True)) as server:
        pid, url = server.proc.pid, server.url
        await asyncio.sleep(2)  # the sandbox pool warms up in the background
        figures["base_rss_mb"] = rss_mb(pid)
        figures["load_average_at_start"] = Path("/proc/loadavg").read_text().split()[0]

        def env(prefix: str, sessions: int | None) -> Callable[[int], dict]:
            def make(n: int) -> dict:
                return {
                    "call_id": f"{prefix}{n}",
                    "name": "get_balance",
                    "arguments": {"account_id": ids[n % len(ids)]},
                    "session": f"{prefix}-{n % sessions if sessions else n}",
                }

            return make

        kinds = {"calculator": calc_call, "search": search_call, "env": env("w", 256)}
        calls = args.measure_calls
        await cpu_per_request(url, pid, env("w", 256), 8, 64)  # the warm sessions exist
        await cpu_per_request(url, pid, calc_call, 20, 64)  # warm-up
        rows: dict[str, dict[int, list[float]]] = {k: {b: [] for b in BATCHES} for k in kinds}
        new_sessions: list[float] = []
        paced: list[float] = []
        for r in range(args.repeats):
            paced.append(await paced_cpu_per_request(url, pid, calc_call))
            for kind, make in kinds.items():
                scale = 4 if kind == "search" else 1  # a search costs ~10x a calculator call
                for b in BATCHES:
                    requests = max(50, calls // scale // max(b, 8))
                    rows[kind][b].append(await cpu_per_request(url, pid, make, requests, b))
            new_sessions.append(await cpu_per_request(url, pid, env(f"n{r}", None), calls // 64, 64) / 64)
        best = {k: {b: min(v) for b, v in per.items()} for k, per in rows.items()}
        fixed = []
        for kind, per_request in best.items():
            post, call = fit_request_cost(per_request)
            figures[f"{kind}_cpu_us"] = call
            figures[f"{kind}_post_cpu_us"] = post
            figures[f"{kind}_per_request_us"] = {str(b): round(v, 1) for b, v in per_request.items()}
            fixed.append(post)
        figures["post_cpu_us"] = sorted(fixed)[len(fixed) // 2]  # the median kind's
        # a 1-call POST to a replica asleep between requests, against one kept busy
        figures["wake_cpu_us"] = max(0.0, min(paced) - best["calculator"][1])
        figures["env_session_start_cpu_us"] = max(0.0, min(new_sessions) - figures["env_cpu_us"])

        # a re-sent call_id (a split POST, a retry) on its own POST: answered from the store
        done = [calc_call(next(SERIAL)) for _ in range(256)]
        await cpu_of(
            url, pid, lambda i: build_post(url + "/v1/calls", calls_body(done[i * 64 : i * 64 + 64])), 4, 1
        )
        figures["replay_post_cpu_us"] = await cpu_of(
            url, pid, lambda i: build_post(url + "/v1/calls", calls_body([done[i]])), 256, 4
        )

        # memory of environment sessions: RSS growth over many live sessions (one call each)
        before = rss_mb(pid)
        first, created = next(SERIAL) + 1, max(4, args.env_sessions // 64) * 64  # n runs from first
        await cpu_per_request(url, pid, lambda n: env("m", None)(n - first), created // 64, 64)
        figures["env_session_mb"] = max(0.0, rss_mb(pid) - before) / created
        figures["env_sessions_measured"] = created
        # releasing them: one DELETE each (a trajectory's last request)
        host = url.split("//", 1)[1]
        release = min(created, 1000)
        figures["release_cpu_us"] = await cpu_of(
            url,
            pid,
            lambda i: (
                f"DELETE /v1/sessions/m-{i} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode()
            ),
            release,
            4,
            check=lambda status, _body: status in (200, 204),
        )
        figures.update(await measure_client(url))
        figures["loop_wake_cpu_us"] = await loop_wake_cpu_us()
        if not args.skip_python:
            figures.update(await measure_python(url, pid, args))
    return figures


async def loop_wake_cpu_us(wakes: int = 500, gap_s: float = 0.002) -> float:
    """CPU of one wake-up of an idle asyncio loop (this process): the machine's constant
    under every "wake" figure (a few µs on bare metal; far more under nested virtualisation)."""
    start = time.process_time()
    for _ in range(wakes):
        await asyncio.sleep(gap_s)
    return (time.process_time() - start) / wakes * 1e6


async def measure_client(url: str, posts: int = 300) -> dict[str, float]:
    """The trainer's ``ToolClient`` CPU (this process) per POST and per call, one caller."""
    from protocol import Call, new_call_id  # noqa: PLC0415 (the bench's parent needs no client otherwise)
    from trainer_client.client.tool_client import ToolClient  # noqa: PLC0415

    per_post: dict[int, float] = {}
    async with ToolClient([url]) as client:
        for b in BATCHES:
            count = max(20, posts // max(1, b // 8))
            start = time.process_time()
            for i in range(count):
                n = next(SERIAL)
                await client.call_tools(
                    [Call(new_call_id(), "calculator", {"expression": f"{n} + {i} * {j}"}) for j in range(b)]
                )
            per_post[b] = (time.process_time() - start) / count * 1e6
    post, call = fit_request_cost(per_post)
    return {"client_post_cpu_us": post, "client_call_cpu_us": call}


async def measure_python(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """Warm call CPU (server + worker), session start CPU, worker PSS per live session."""
    tag = uuid.uuid4().hex[:6]
    n = args.py_sessions
    pss_before = children_pss_mb(pid)
    procs_before = len(descendants(pid))

    def first(k: int) -> dict:
        # k runs over n consecutive numbers: k % n names each session once
        return {
            "call_id": f"pf{k}",
            "name": "python",
            "arguments": {"code": "x = 0"},
            "session": f"py{tag}-{k % n}",
        }

    def warm(k: int) -> dict:
        code = f"x += 1\nsum(range({100 + k % 7}))"
        return {
            "call_id": f"pw{k}",
            "name": "python",
            "arguments": {"code": code},
            "session": f"py{tag}-{k % n}",
        }

    start_cpu = await cpu_per_request(url, pid, first, 1, n, concurrency=1) / n  # n sessions, one call each
    await asyncio.sleep(3)  # the pool refills; its workers are measured below with the rest
    warm_runs = [await cpu_per_request(url, pid, warm, 20, n) / n for _ in range(args.repeats)]
    workers = len(descendants(pid)) - procs_before
    pss = (children_pss_mb(pid) - pss_before) / n
    return {
        "python_cpu_us": min(warm_runs),
        "python_session_start_cpu_us": max(0.0, start_cpu - min(warm_runs)),
        "python_session_pss_mb": pss,
        "python_sessions_measured": n,
        "python_new_processes": workers,
    }


# ----------------------------------------------------------------------------- (b) model
def kinds_from(figures: dict[str, Any], python_mb: float | None) -> dict[str, ToolKind]:
    kinds = {
        "calculator": ToolKind(cpu_us=figures["calculator_cpu_us"]),
        "search": ToolKind(cpu_us=figures["search_cpu_us"]),
        "env": ToolKind(
            cpu_us=figures["env_cpu_us"],
            session_mb=max(figures["env_session_mb"], 0.001),
            session_start_cpu_us=figures["env_session_start_cpu_us"],
        ),
    }
    if "python_cpu_us" in figures:
        kinds["python"] = ToolKind(
            cpu_us=figures["python_cpu_us"],
            session_mb=python_mb if python_mb is not None else figures["python_session_pss_mb"],
            session_start_cpu_us=figures["python_session_start_cpu_us"],
            sandbox=True,
        )
    return kinds


MIXES = {
    "search-heavy (stateless)": {"search": 0.8, "calculator": 0.2},
    "environment (one world each)": {"env": 1.0},
    "sandbox-heavy": {"python": 0.7, "search": 0.3},
}


def replica_spec(figures: dict[str, Any], **overrides: Any) -> ReplicaSpec:
    """A replica with part (a)'s request costs and RSS; ``overrides`` set its size and caps."""
    costs = {
        "base_mb": figures["base_rss_mb"],
        "post_cpu_us": figures["post_cpu_us"],
        "release_cpu_us": figures["release_cpu_us"],
        "wake_cpu_us": figures.get("wake_cpu_us", 0.0),
    }
    return ReplicaSpec(**{**costs, **overrides})


def client_cost(figures: dict[str, Any]) -> ClientCost:
    return ClientCost(figures["client_post_cpu_us"], figures["client_call_cpu_us"])


def model_table(figures: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    kinds = kinds_from(figures, args.python_session_mb)
    spec = replica_spec(figures, cores=args.cores, ram_mb=args.ram_gb * 1024, max_workers=args.max_workers)
    rows = []
    for name, mix in MIXES.items():
        if not set(mix) <= set(kinds):
            continue
        for n in (1024, 4096, 65_536):
            procs = max(1, n // 1024)
            # the batch a client makes depends on its rate to each replica: plan for one
            # replica, then again with the rate spread over the replicas that plan needs
            replicas = 1
            for _ in range(2):
                batch = calls_per_post(n * args.rate / procs / replicas)
                work = Workload(
                    n, args.rate, mix, calls_per_trajectory=10, client_processes=procs, calls_per_post=batch
                )
                p = plan(work, kinds, spec, client_cost(figures))
                replicas = p.replicas
            rows.append(
                {
                    "mix": name,
                    "N": n,
                    "replicas": p.replicas,
                    "binding": p.binding,
                    "calls_per_post": round(batch, 2),
                    "server_us_per_call": round(p.cpu_us_per_call, 1),
                    "client_cores": round(p.client_cores, 2),
                    "needs": {k: round(v, 2) for k, v in p.needs.items()},
                }
            )
    return rows


# ------------------------------------------------------------------------ (c) simulation
def ms(value: float | None) -> str:
    """A latency, or a dash where no call finished inside the window (a starved client)."""
    return "-" if value is None else f"{value:.1f} ms"


async def client_main(args: argparse.Namespace) -> None:
    """One client process: ``--trajectories`` simulated trajectories through one ToolClient."""
    from protocol import Call, new_call_id  # noqa: PLC0415 (client mode only)
    from trainer_client.client.tool_client import ToolClient  # noqa: PLC0415

    mix = json.loads(args.mix)
    names, weights = list(mix), list(mix.values())
    ids = accounts()
    rng = random.Random(args.seed)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    counted = releases = 0
    await asyncio.sleep(max(0.0, args.start_at - time.time()))  # every client and the parent: one window
    begin = time.monotonic()
    measure_from, stop_at = begin + args.warmup, begin + args.warmup + args.duration
    cpu_at: list[float] = []

    async with ToolClient(args.urls.split(",")) as client:

        async def trajectory(k: int) -> None:
            nonlocal counted, releases
            await asyncio.sleep(rng.uniform(0, args.think_s))  # spread the starts
            while time.monotonic() < stop_at:
                session = f"t{args.seed}-{k}-{uuid.uuid4().hex[:8]}"
                for _ in range(args.calls_per_traj):
                    await asyncio.sleep(rng.expovariate(1 / args.think_s))
                    if time.monotonic() >= stop_at:
                        break
                    kind = rng.choices(names, weights)[0]
                    if kind == "calculator":
                        call = Call(new_call_id(), "calculator", {"expression": f"{k} * 7 + 1"})
                    elif kind == "search":
                        query = f"{rng.choice(WORDS)} {rng.choice(WORDS)} {rng.randrange(10**9)}"
                        call = Call(new_call_id(), "search", {"query": query})
                    elif kind == "env":
                        call = Call(new_call_id(), "get_balance", {"account_id": ids[k % len(ids)]}, session)
                    else:
                        call = Call(new_call_id(), "python", {"code": "x = 1\nx + 1"}, session)
                    t0 = time.monotonic()
                    (result,) = await client.call_tools([call])
                    t1 = time.monotonic()
                    if measure_from <= t1 < stop_at:
                        counted += 1
                        latencies.append(t1 - t0)
                        if result.is_error:
                            kind_name = result.error.kind.value if result.error else "error"
                            errors[kind_name] = errors.get(kind_name, 0) + 1
                releases += 1
                await client.release_session(session)

        async def clock() -> None:
            await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
            cpu_at.append(time.process_time())
            await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
            cpu_at.append(time.process_time())

        tasks = [asyncio.ensure_future(trajectory(k)) for k in range(args.trajectories)]
        await clock()
        # a loaded box leaves calls in flight at the end: wait a little, then stop them
        _, late = await asyncio.wait(tasks, timeout=5)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        batches = client.metrics()
    latencies.sort()
    out = {
        "calls": counted,
        "errors": errors,
        "cpu_s": cpu_at[1] - cpu_at[0] if len(cpu_at) == 2 else None,
        "p50": percentile(latencies, 0.5) if latencies else None,
        "p99": percentile(latencies, 0.99) if latencies else None,
        "lat_sample": latencies[:: max(1, len(latencies) // 2000)],
        "mean_batch": batches["mean_batch_size"],
        "posts": batches["batches"],
        "splits": batches["split_posts"],
        "calls_sent": batches["calls_sent"],
        "releases": releases,
    }
    print(json.dumps(out))


def start_clients(
    urls: list[str], n_traj: int, think_s: float, start_at: float, args: argparse.Namespace
) -> list[subprocess.Popen]:
    procs = []
    share = [n_traj // args.clients + (1 if i < n_traj % args.clients else 0) for i in range(args.clients)]
    for i, count in enumerate(share):
        cmd = [
            sys.executable,
            str(Path(__file__)),
            "client",
            "--urls",
            ",".join(urls),
            "--trajectories",
            str(count),
            "--think-s",
            str(think_s),
            "--warmup",
            str(args.warmup),
            "--duration",
            str(args.duration),
            "--calls-per-traj",
            str(args.calls_per_traj),
            "--mix",
            json.dumps(args.sim_mix),
            "--seed",
            str(i),
            "--start-at",
            str(start_at),
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def sim_workload(args: argparse.Namespace, batch: float, split_share: float = 0.0) -> Workload:
    """The simulation's mix at a batch size and split share (the rate does not matter per call)."""
    return Workload(
        1000,
        1.0,
        args.sim_mix,
        calls_per_trajectory=args.calls_per_traj,
        calls_per_post=max(1.0, batch),
        split_share=split_share,
    )


async def simulate(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Part (c): replicas and client processes on this box's cores, stepped through loads."""
    kinds = kinds_from(figures, None)
    client = client_cost(figures)
    cores = os.cpu_count() or 2
    addresses = [f"127.0.0.{2 + i}" for i in range(args.replicas)]
    # the replicas-only view: the box's cores split over replicas, clients elsewhere
    spec = replica_spec(figures, cores=cores / args.replicas, ram_mb=4096, utilisation=1.0)
    probe = plan(sim_workload(args, args.sim_batch), kinds, spec, client)
    replicas_only = probe.capacity_calls_per_s * args.replicas
    # the box's view: replicas and clients share its cores; a replica's busy share (which
    # decides the wake-up cost) follows from the rate, so iterate to the fixed point
    client_us = client.per_call_us(sim_workload(args, args.sim_batch))
    busy = 1.0
    for _ in range(5):
        probe = plan(sim_workload(args, args.sim_batch), kinds, spec, client, busy=busy)
        predicted = cores * 1e6 / (probe.cpu_us_per_call + client_us)
        busy = predicted * probe.cpu_us_per_call / 1e6 / args.replicas
    note(
        f"model at {args.sim_batch:g} calls/POST: server {probe.cpu_us_per_call:.1f} + client {client_us:.1f} "
        f"µs per call -> {predicted:,.0f} calls/s on {cores} cores ({replicas_only:,.0f} with the clients elsewhere)"
    )
    steps = []
    port = common_port(addresses)
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                running_server(replica_config(False, search=True), host=a, extra_args=["--port", str(port)])
            )
            for a in addresses
        ]
        urls = [s.url for s in servers]
        pids = [s.proc.pid for s in servers]
        for factor in args.loads:
            offered = predicted * factor
            n_traj = max(args.clients, round(offered * args.think_s))
            note(
                f"load {factor:.2f}x: {n_traj} trajectories, think {args.think_s * 1000:.0f} ms -> {offered:,.0f} calls/s offered"
            )
            steps.append(await sim_step(args, urls, pids, n_traj, offered, factor))
            step = steps[-1]
            workload = sim_workload(args, step["mean_batch"], step["split_share"])
            busy = step["server_cores"] / args.replicas  # each replica's measured busy share
            step["model_server_us"] = plan(workload, kinds, spec, busy=busy).cpu_us_per_call
            step["model_client_us"] = client.per_call_us(workload)
            step["model_box"] = cores * 1e6 / (step["model_server_us"] + step["model_client_us"])
            per_client_replica = step["achieved"] / args.clients / args.replicas
            step["model_batch"] = calls_per_post(per_client_replica)
            note(
                f"  achieved {step['achieved']:,.0f} calls/s, p50 {ms(step['p50_ms'])}, p99 {ms(step['p99_ms'])}, "
                f"{step['mean_batch']:.1f} calls/POST, {step['split_share']:.2f} split POSTs per call"
            )
    return {
        "predicted": predicted,
        "replicas_only": replicas_only,
        "model_cpu_us": probe.cpu_us_per_call,
        "model_client_us": client_us,
        "steps": steps,
    }


async def sim_step(
    args: argparse.Namespace, urls: list[str], pids: list[int], n_traj: int, offered: float, factor: float
) -> dict[str, Any]:
    """One load step: start the clients, read the replicas' CPU over the window, gather."""
    start_at = time.time() + args.startup
    procs = start_clients(urls, n_traj, args.think_s, start_at, args)
    await asyncio.sleep(start_at - time.time())
    cpu0 = sum(tree_cpu_s(p) for p in pids)
    await asyncio.sleep(args.warmup)
    cpu1 = sum(tree_cpu_s(p) for p in pids)
    await asyncio.sleep(args.duration)
    cpu2 = sum(tree_cpu_s(p) for p in pids)
    outs = []
    for proc in procs:
        stdout, stderr = await asyncio.to_thread(proc.communicate, timeout=args.warmup + args.duration + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"client failed: {stderr[-2000:]}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    calls = sum(o["calls"] for o in outs)
    sent = max(1, sum(o["calls_sent"] for o in outs))
    lat = sorted(x for o in outs for x in o["lat_sample"])
    errors: dict[str, int] = {}
    for o in outs:
        for k, v in o["errors"].items():
            errors[k] = errors.get(k, 0) + v
    client_cpu = sum(o["cpu_s"] or 0 for o in outs)
    return {
        "factor": factor,
        "trajectories": n_traj,
        "offered": offered,
        "achieved": calls / args.duration,
        "p50_ms": percentile(lat, 0.5) * 1000 if lat else None,
        "p99_ms": percentile(lat, 0.99) * 1000 if lat else None,
        "errors": errors,
        "server_cpu_us": (cpu2 - cpu1) / max(1, calls) * 1e6,
        "client_cpu_us": client_cpu / max(1, calls) * 1e6,
        "server_cores": (cpu2 - cpu1) / args.duration,
        "client_cores": client_cpu / args.duration,
        "warmup_server_cores": (cpu1 - cpu0) / args.warmup,
        # what the clients sent over their whole run: calls per batch POST, split POSTs
        # and session releases per call
        "mean_batch": sent / max(1, sum(o["posts"] for o in outs)),
        "split_share": sum(o["splits"] for o in outs) / sent,
        "release_share": sum(o["releases"] for o in outs) / sent,
        "load_average": Path("/proc/loadavg").read_text().split()[0],
    }


# ------------------------------------------------------------------------------ printing
def report(
    figures: dict[str, Any], table: list[dict[str, Any]], sim: dict[str, Any] | None, args: argparse.Namespace
) -> None:
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"## (a) one replica, this machine (load average {load})")
    for key, value in figures.items():
        print(f"  {key:<32} {value:,.3f}" if isinstance(value, float) else f"  {key:<32} {value}")
    print(
        f"\n## (b) model: replicas of {args.cores} cores / {args.ram_gb} GiB at 70 %, "
        f"{args.rate} calls/s per trajectory, max_workers {args.max_workers}, a client process per 1,024"
    )
    print(
        "| mix | N | replicas | binding | calls/POST | server µs/call | client cores "
        "| needs (cpu / memory / sandbox / sessions / slots / connections) |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---|")
    for r in table:
        needs = " / ".join(f"{v:g}" for v in r["needs"].values())
        print(
            f"| {r['mix']} | {r['N']:,} | {r['replicas']} | {r['binding']} | {r['calls_per_post']:g} "
            f"| {r['server_us_per_call']:g} | {r['client_cores']:g} | {needs} |"
        )
    if sim is None:
        return
    cores = os.cpu_count() or 2
    print(
        f"\n## (c) simulation: {args.replicas} replicas + {args.clients} client processes on {cores} cores, "
        f"mix {args.sim_mix}; the model at {args.sim_batch:g} calls/POST predicts {sim['predicted']:,.0f} calls/s "
        f"(server {sim['model_cpu_us']:.1f} + client {sim['model_client_us']:.1f} µs per call; "
        f"{sim['replicas_only']:,.0f} with the clients elsewhere)"
    )
    print(
        "| load x predicted | trajectories | achieved calls/s | p50 | p99 | errors | calls/POST (model) "
        "| split POSTs/call | server µs/call (model) | client µs/call (model) | server / client cores "
        "| box calls/s, model at this batch | load avg |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in sim["steps"]:
        print(
            f"| {s['factor']:.2f} | {s['trajectories']:,} | {s['achieved']:,.0f} | {ms(s['p50_ms'])} | "
            f"{ms(s['p99_ms'])} | {sum(s['errors'].values())} | {s['mean_batch']:.1f} ({s['model_batch']:.1f}) | "
            f"{s['split_share']:.2f} | {s['server_cpu_us']:.0f} ({s['model_server_us']:.0f}) | "
            f"{s['client_cpu_us']:.0f} ({s['model_client_us']:.0f}) | "
            f"{s['server_cores']:.2f} / {s['client_cores']:.2f} | {s['model_box']:,.0f} | {s['load_average']} |"
        )


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode")
    client = sub.add_parser("client", help="(internal) one simulation client process")
    client.add_argument("--urls", required=True)
    client.add_argument("--trajectories", type=int, required=True)
    client.add_argument("--think-s", type=float, required=True)
    client.add_argument("--warmup", type=float, required=True)
    client.add_argument("--duration", type=float, required=True)
    client.add_argument("--calls-per-traj", type=int, required=True)
    client.add_argument("--mix", required=True)
    client.add_argument("--seed", type=int, default=0)
    client.add_argument("--start-at", type=float, required=True, help="wall-clock time to start at")
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke run")
    parser.add_argument("--skip-python", action="store_true", help="no sandbox tool (where it cannot run)")
    parser.add_argument("--skip-sim", action="store_true", help="parts (a) and (b) only")
    parser.add_argument("--figures", help='reuse part (a): a file with the {"figures": ...} line it printed')
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure-calls", type=int, default=6400, help="calls per CPU measurement")
    parser.add_argument("--env-sessions", type=int, default=4000, help="live environment sessions for memory")
    parser.add_argument("--py-sessions", type=int, default=32, help="live python sessions for memory")
    parser.add_argument(
        "--python-session-mb",
        type=float,
        default=None,
        help="memory per python session for the model (e.g. bench/environments/python_sandbox.py's PSS at 1,024); "
        "default: this run's PSS over --py-sessions",
    )
    parser.add_argument("--cores", type=float, default=4, help="model: cores per replica (the k8s limit)")
    parser.add_argument("--ram-gb", type=float, default=8, help="model: RAM per replica")
    parser.add_argument("--max-workers", type=int, default=1024, help="model: python tool's max_workers")
    parser.add_argument("--rate", type=float, default=0.1, help="model: calls per second per trajectory")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--loads", default="0.1,0.5,1,1.5", help="offered load, times the prediction")
    parser.add_argument(
        "--think-s", type=float, default=0.2, help="mean think time between a trajectory's calls"
    )
    parser.add_argument("--calls-per-traj", type=int, default=10)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--startup", type=float, default=6, help="seconds the client processes get to start")
    parser.add_argument("--duration", type=float, default=15)
    parser.add_argument(
        "--sim-mix", default='{"search": 0.5, "env": 0.5}', help="simulation: share of calls by kind (JSON)"
    )
    parser.add_argument(
        "--sim-batch", type=float, default=8, help="model: calls per POST the client coalesces"
    )
    args = parser.parse_args(argv)
    if args.mode != "client":
        args.loads = [float(x) for x in args.loads.split(",")]
        args.sim_mix = json.loads(args.sim_mix)
        if args.quick:
            args.repeats, args.measure_calls, args.env_sessions, args.py_sessions = 1, 640, 500, 8
            args.loads, args.warmup, args.duration, args.replicas, args.clients = [0.02, 0.05], 2, 4, 2, 2
    return args


def main() -> None:
    args = parse(sys.argv[1:])
    if args.mode == "client":
        asyncio.run(client_main(args))
        return
    started = time.monotonic()
    note("part (a): measuring one replica")
    if args.figures:  # part (a) from an earlier run's JSON line
        figures = json.loads(Path(args.figures).read_text())["figures"]
    else:
        figures = asyncio.run(measure(args))
    table = model_table(figures, args)
    print(json.dumps({"figures": figures}), flush=True)
    sim = None
    if not args.skip_sim:
        note("part (c): simulation")
        sim = asyncio.run(simulate(figures, args))
    report(figures, table, sim, args)
    print(f"\nwall {time.monotonic() - started:.0f} s")
    print(json.dumps({"figures": figures, "sim": sim}, default=str))


if __name__ == "__main__":
    main()
