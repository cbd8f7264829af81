"""One call per request, side by side in one run: our tool server and OpenEnv's echo environment.

Issue 28 goal 4: a caller that sends one call and waits for its answer (an agent framework, an
environment's step loop). Each caller loops "send one call, wait for its answer":

(a) ours, POST /v1/calls with one call per POST, a keep-alive connection per caller (bench/loadgen.py);
(b) ours, WebSocket GET /v1/stream, a connection per caller, one call per frame;
(c) OpenEnv's echo environment over its WebSocket /ws, a connection per caller: reset once, then steps;
(d) episodes of 8 calls: ours over /v1/stream with a session (its first call opens it, a release frame
    closes it); OpenEnv's reset / 8 steps / close (its close ends the connection: a new one per
    episode) and, as its best case, reset / 8 steps on a kept connection.

Each server in its own process, one uvicorn worker; the load generator in this process. (b)-(d) use
the same raw ``websockets`` client for both servers: only the message shapes differ. Which client
(``--client``): ``tuned`` (the default: no compression offered, no pings, orjson, uvloop),
``plain`` (what a user writes first: ``websockets.connect(url)`` with its defaults, so deflate is
offered and each server takes it or not, pings every 20 s; stdlib ``json``; asyncio's own loop)
or ``plain-nodeflate`` (``plain`` with ``compression=None``: neither server compresses).
``--pin`` puts every thread of the servers on CPU 0 and the load generator on CPU 1. Every answer is checked: its text must be what was sent, or the bench stops. Each
call's text is 12 characters, unique, the same on both sides.

Per path: calls/s (episodes/s), p50 and p99 latency per call (per episode), the server's CPU per call
(per episode, from /proc/<pid>/stat) and this process's; runs alternate between paths (``--repeats``;
the table shows the fastest run, and the range). Load averages at the start and the end.

    python bench/peers/single_calls.py [--quick] [--repeats 3] [--callers 32,1024] [--paths a,b,c,d]
        [--openenv-python .venv-peers/bin/python] [--calls N] [--episodes N]
        [--client tuned|plain|plain-nodeflate] [--pin]

OpenEnv 0.10.0 runs from its own virtual environment (``make peers``): the echo environment is the
one ``python -m openenv.cli init`` writes (the package ships no envs/echo_env), served by
``create_app`` as the template's server/app.py does, with room for every caller's session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedOK, WebSocketException

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.loadgen import LoadResult, build_post, run_load  # noqa: E402
from bench.server.server_throughput import (  # noqa: E402
    Server,
    best_of,
    cpu_seconds,
    free_port,
    repeats_paths_and_callers,
    row,
    serve_tree,
)
from tests.support.processes import started  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ALL_PATHS = "a,b,c,d"
EPISODE_CALLS = 8
TEXT_WIDTH = 12  # characters of each call's text: unique per call, the same payload on both sides

# The template's server/app.py, with max_concurrent_envs raised so that every caller gets a session
# (the template says to raise it; at 1 a second WebSocket is refused).
OPENENV_SERVER = """
import sys, uvicorn
sys.path.insert(0, sys.argv[1])
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.echo_env_environment import EchoEnvironment
from openenv.core.env_server.http_server import create_app
app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env",
                 max_concurrent_envs=int(sys.argv[3]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""
VERSIONS = """
import importlib.metadata as m
for name in ("openenv", "uvicorn", "websockets", "uvloop", "httptools"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "absent")
"""


@dataclass(frozen=True)
class WsClient:
    """How the load generator's WebSocket client connects, writes and reads (``--client``)."""

    what: str
    options: dict[str, Any] = field(default_factory=dict)  # websockets' connect() keywords
    dumps: Callable[[Any], str] = json.dumps
    loads: Callable[[str | bytes], Any] = json.loads
    uvloop: bool = False


CLIENTS = {
    "tuned": WsClient(
        "no compression offered, no pings, orjson, uvloop",
        {"compression": None, "ping_interval": None},
        lambda obj: orjson.dumps(obj).decode(),
        orjson.loads,
        uvloop=True,
    ),
    "plain": WsClient("websockets.connect() defaults (deflate offered, pings), stdlib json, asyncio's loop"),
    "plain-nodeflate": WsClient(
        "websockets.connect(compression=None), stdlib json, asyncio's loop", {"compression": None}
    ),
}
CLIENT = CLIENTS["tuned"]  # main() sets the one --client names


class Mismatch(RuntimeError):
    """An answer that is not the echo of what was sent: the bench stops, its figures would be wrong."""


def text_for(i: int) -> str:
    return f"t{i:0{TEXT_WIDTH - 1}d}"


def ws_url(http_url: str, path: str) -> str:
    return "ws" + http_url.removeprefix("http") + path


async def open_ws(url: str) -> ClientConnection:
    # The same client for every server (--client says which).
    return await connect(url, open_timeout=120, close_timeout=30, **CLIENT.options)


async def exchange(ws: ClientConnection, frame: str, check: Callable[[str | bytes], None]) -> None:
    await ws.send(frame)  # a text frame: OpenEnv reads text only
    check(await ws.recv())


# What travels, per server: the same client code sends these frames and checks these answers.
class Shape:
    path = ""
    new_connection_per_episode = False

    def start_frame(self) -> str | None:
        """Sent once on each new connection before the calls (OpenEnv: a reset)."""
        return None

    def check_start(self, answer: str | bytes) -> None:
        pass

    def call_frame(self, call_id: str, text: str, session: str | None = None) -> str:
        raise NotImplementedError

    def check_call(self, answer: str | bytes, call_id: str, text: str) -> None:
        raise NotImplementedError

    def open_frame(self, session: str) -> str | None:
        """Sent at the start of an episode (OpenEnv: a reset; ours: none, the first call opens it)."""
        return None

    async def close_episode(self, ws: ClientConnection, session: str) -> None:
        """End an episode and wait until the server says it has."""


class Ours(Shape):
    path = "/v1/stream"

    def call_frame(self, call_id: str, text: str, session: str | None = None) -> str:
        call: dict = {"call_id": call_id, "name": "echo", "arguments": {"text": text}}
        if session is not None:
            call["session"] = session
        return CLIENT.dumps({"calls": [call]})

    def check_call(self, answer: str | bytes, call_id: str, text: str) -> None:
        check_results(answer, call_id, text)

    async def close_episode(self, ws: ClientConnection, session: str) -> None:
        await ws.send(CLIENT.dumps({"release": session}))
        answer = await ws.recv()
        if CLIENT.loads(answer) != {"released": session}:
            raise Mismatch(f"release of {session!r} answered {answer[:300]!r}")


class OpenEnv(Shape):
    path = "/ws"
    new_connection_per_episode = True  # its close message ends the WebSocket

    def start_frame(self) -> str | None:
        return '{"type":"reset","data":{}}'

    def check_start(self, answer: str | bytes) -> None:
        if CLIENT.loads(answer).get("type") != "observation":
            raise Mismatch(f"OpenEnv answered a reset with {answer[:300]!r}")

    def call_frame(self, call_id: str, text: str, session: str | None = None) -> str:
        return CLIENT.dumps({"type": "step", "data": {"message": text}})

    def check_call(self, answer: str | bytes, call_id: str, text: str) -> None:
        data = CLIENT.loads(answer)
        observation = (data.get("data") or {}).get("observation") or {}
        if data.get("type") != "observation" or observation.get("echoed_message") != text:
            raise Mismatch(f"OpenEnv answered a step of {text!r} with {answer[:300]!r}")

    def open_frame(self, session: str) -> str | None:
        return self.start_frame()

    async def close_episode(self, ws: ClientConnection, session: str) -> None:
        await ws.send('{"type":"close"}')
        try:  # the server destroys the session, then closes the WebSocket
            answer = await ws.recv()
        except ConnectionClosedOK:
            return
        raise Mismatch(f"OpenEnv answered a close with {answer[:300]!r}")


class OpenEnvKept(OpenEnv):
    """Episodes on a kept connection: a reset starts the next one (OpenEnv's best case)."""

    new_connection_per_episode = False

    async def close_episode(self, ws: ClientConnection, session: str) -> None:
        pass


def check_results(answer: str | bytes, call_id: str, text: str) -> None:
    """Ours: one result, for this call, not an error, echoing ``text``."""
    results = CLIENT.loads(answer).get("results") or [{}]
    got = results[0]
    structured = got.get("structured") or {}
    if (
        len(results) != 1
        or got.get("call_id") != call_id
        or got.get("is_error")
        or structured.get("text") != text
    ):
        raise Mismatch(f"call {call_id!r} with text {text!r} answered {answer[:300]!r}")


@dataclass
class Measured:
    result: LoadResult
    server_cpu_s: float
    client_cpu_s: float


async def metered(pid: int, work: Awaitable[LoadResult]) -> Measured:
    """The work's result with the CPU seconds the server and this process spent meanwhile."""
    server, client = cpu_seconds(pid), time.process_time()
    result = await work
    return Measured(result, cpu_seconds(pid) - server, time.process_time() - client)


async def posts(server: Server, concurrency: int, total: int, tag: str) -> Measured:
    """(a): one call per POST /v1/calls, a keep-alive connection per caller; the call id carries
    the index of its text, so that each answer is checked against what was sent."""
    url = server.url + "/v1/calls"

    def make(i: int) -> bytes:
        call = {"call_id": f"{tag}{i}", "name": "echo", "arguments": {"text": text_for(i)}}
        return build_post(url, orjson.dumps({"calls": [call]}))

    def check(status: int, body: bytes) -> bool:
        call_id = str((orjson.loads(body).get("results") or [{}])[0].get("call_id"))
        index = call_id.removeprefix(tag)
        check_results(body, call_id, text_for(int(index)) if index.isdigit() else "")
        return True

    done = await metered(
        server.pid, run_load(url, make, concurrency=concurrency, total_requests=total, check=check)
    )
    if done.result.errors:  # a refused or dropped request is no answer: the figures would not hold
        raise Mismatch(f"{done.result.errors} POSTs failed (statuses {done.result.statuses})")
    return done


async def ws_calls(server: Server, shape: Shape, concurrency: int, total: int, tag: str) -> Measured:
    """(b), (c): a connection per caller (opened, and reset, before the clock starts), then calls."""
    url = ws_url(server.url, shape.path)
    conns = await asyncio.gather(*(open_ws(url) for _ in range(concurrency)))
    try:
        if (start := shape.start_frame()) is not None:
            await asyncio.gather(*(exchange(ws, start, shape.check_start) for ws in conns))
        result, counter = LoadResult(), iter(range(total))

        async def caller(ws: ClientConnection) -> None:
            for i in counter:
                call_id, text = f"{tag}{i}", text_for(i)
                began = time.perf_counter()
                await ws.send(shape.call_frame(call_id, text))
                answer = await ws.recv()
                result.latencies.append(time.perf_counter() - began)
                shape.check_call(answer, call_id, text)
                result.requests += 1

        async def load() -> LoadResult:
            began = time.perf_counter()
            await asyncio.gather(*(caller(ws) for ws in conns))
            result.wall_s = time.perf_counter() - began
            return result

        return await metered(server.pid, load())
    finally:
        await asyncio.gather(*(ws.close() for ws in conns))


async def episodes(server: Server, shape: Shape, concurrency: int, total: int, tag: str) -> Measured:
    """(d): episodes of EPISODE_CALLS calls; latency per episode. A kept connection per caller is
    opened before the clock starts; a connection per episode (OpenEnv's close) is timed with it."""
    url = ws_url(server.url, shape.path)
    kept = (
        []
        if shape.new_connection_per_episode
        else await asyncio.gather(*(open_ws(url) for _ in range(concurrency)))
    )
    result, counter = LoadResult(), iter(range(total))

    async def play(ws: ClientConnection, e: int) -> None:
        session = f"{tag}{e}"
        if (frame := shape.open_frame(session)) is not None:
            await exchange(ws, frame, shape.check_start)
        for j in range(EPISODE_CALLS):
            call_id, text = f"{session}-{j}", text_for(e * EPISODE_CALLS + j)
            await ws.send(shape.call_frame(call_id, text, session))
            shape.check_call(await ws.recv(), call_id, text)
        await shape.close_episode(ws, session)

    async def caller(ws: ClientConnection | None) -> None:
        for e in counter:
            began = time.perf_counter()
            if ws is None:
                async with await open_ws(url) as fresh:
                    await play(fresh, e)
            else:
                await play(ws, e)
            result.latencies.append(time.perf_counter() - began)
            result.requests += 1

    async def load() -> LoadResult:
        began = time.perf_counter()
        await asyncio.gather(*(caller(kept[n] if kept else None) for n in range(concurrency)))
        result.wall_s = time.perf_counter() - began
        return result

    try:
        return await metered(server.pid, load())
    finally:
        await asyncio.gather(*(ws.close() for ws in kept))


async def stream_problem(server: Server) -> str | None:
    """None when our GET /v1/stream answers an echo call over a WebSocket; else what went wrong."""
    try:
        async with await open_ws(ws_url(server.url, Ours.path)) as ws:
            frame = Ours().call_frame("probe-0", text_for(0))
            await asyncio.wait_for(
                exchange(ws, frame, lambda a: check_results(a, "probe-0", text_for(0))), 60
            )
    except (OSError, WebSocketException, Mismatch, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# (letter, row name, server key, unit, runner)
Runner = Callable[[Server, int, int, str], Awaitable[Measured]]
PLAN: list[tuple[str, str, str, str, Runner]] = [
    ("a", "(a) ours: POST /v1/calls, 1 call per POST", "ours", "call", posts),
    ("b", "(b) ours: WebSocket /v1/stream, 1 call per frame", "stream", "call",
     lambda s, c, n, t: ws_calls(s, Ours(), c, n, t)),
    ("c", "(c) OpenEnv echo env: WebSocket /ws step", "openenv", "call",
     lambda s, c, n, t: ws_calls(s, OpenEnv(), c, n, t)),
    ("d", f"(d) ours: episode, {EPISODE_CALLS} calls + release over /v1/stream", "stream", "episode",
     lambda s, c, n, t: episodes(s, Ours(), c, n, t)),
    ("d", f"(d) OpenEnv: episode, reset + {EPISODE_CALLS} steps + close (new connection)", "openenv", "episode",
     lambda s, c, n, t: episodes(s, OpenEnv(), c, n, t)),
    ("d", f"(d) OpenEnv: episode, reset + {EPISODE_CALLS} steps (connection kept)", "openenv", "episode",
     lambda s, c, n, t: episodes(s, OpenEnvKept(), c, n, t)),
]  # fmt: skip


async def run_all(
    servers: dict[str, Server],
    paths: set[str],
    callers: list[int],
    calls: int,
    episode_count: int,
    repeats: int,
) -> tuple[list[dict], int]:
    """Every selected path at every caller count, runs interleaved (the order reversed every other
    repeat); each run after an unmeasured warm-up of a tenth as much. Returns the rows and how
    many answers were checked."""
    if "ours" in servers and paths & {"b", "d"} and (problem := await stream_problem(servers["ours"])):
        print(
            f"(b) and ours in (d) skipped: GET /v1/stream did not answer an echo call ({problem}); "
            "they run once the tool server serves the stream (tool_server/api/stream.py)",
            file=sys.stderr,
        )
    elif "ours" in servers:
        servers = {**servers, "stream": servers["ours"]}
    plan = [entry for entry in PLAN if entry[0] in paths and entry[2] in servers]
    rows, checked = [], 0
    for concurrency in callers:
        runs: dict[str, list[dict]] = {name: [] for _, name, *_ in plan}
        for rep in range(repeats):
            for index, (_, name, key, unit, runner) in enumerate(plan if rep % 2 == 0 else plan[::-1]):
                total = max(calls, 8 * concurrency) if unit == "call" else max(episode_count, 2 * concurrency)
                tag = f"c{concurrency}r{rep}p{index}-"
                await runner(servers[key], concurrency, max(concurrency, total // 10), "w" + tag)
                done = await runner(servers[key], concurrency, total, tag)
                checked += done.result.requests * (EPISODE_CALLS if unit == "episode" else 1)
                r = row(name, concurrency, done.result.requests, done.result, 1, done.server_cpu_s)
                r["unit"] = unit
                r["client_cpu_us"] = done.client_cpu_s / max(done.result.requests, 1) * 1e6
                runs[name].append(r)
                print(
                    f"  {name} x{concurrency}: {r['calls_per_s']:,.0f} {unit}s/s, p50 {r['p50_ms']:.2f} ms, "
                    f"{r['server_cpu_us']:.0f} µs server CPU/{unit}, load {r['load']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
        rows += [best_of(runs[name]) for _, name, *_ in plan]
    return rows, checked


def render(rows: list[dict]) -> str:
    lines = [
        "| path | callers | per s | p50 ms | p99 ms | server CPU µs per call or episode (range) "
        "| client CPU µs | all runs, per s | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cpu = f"{r['server_cpu_us']:.1f}"
        if r.get("runs", 1) > 1:
            cpu += " ({:.1f}–{:.1f})".format(*r["cpu_range"])
        spread = "{:,.0f}–{:,.0f} ({})".format(*r["range"], r["runs"]) if r.get("runs", 1) > 1 else ""
        lines.append(
            f"| {r['path']} | {r['callers']} | {r['calls_per_s']:,.0f} {r['unit']}s | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {cpu} | {r['client_cpu_us']:.1f} | {spread} | {r['load']:.1f} |"
        )
    ratios = ratio_lines(rows)
    return "\n".join(lines + ([""] + ratios if ratios else []))


def ratio_lines(rows: list[dict]) -> list[str]:
    """Ours against OpenEnv, per caller count: throughput, p50 and server CPU, and goal 4's verdict
    (one call per request at 32 callers: ≥ 3× OpenEnv's calls/s with a p50 no higher than theirs)."""

    def find(prefix: str, callers: int) -> dict | None:
        return next((r for r in rows if r["path"].startswith(prefix) and r["callers"] == callers), None)

    lines = [
        "| callers | ours | OpenEnv | per s, ours/OpenEnv | p50, ours/OpenEnv | server CPU, ours/OpenEnv | goal at 32 callers: ≥ 3×, p50 ≤ |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    pairs = [("(a)", "(c)"), ("(b)", "(c)"), ("(d) ours", f"(d) OpenEnv: episode, reset + {EPISODE_CALLS} steps + close"),
             ("(d) ours", f"(d) OpenEnv: episode, reset + {EPISODE_CALLS} steps (connection kept)")]  # fmt: skip
    for callers in sorted({r["callers"] for r in rows}):
        for ours_prefix, theirs_prefix in pairs:
            ours, theirs = find(ours_prefix, callers), find(theirs_prefix, callers)
            if ours is None or theirs is None:
                continue
            speed = ours["calls_per_s"] / theirs["calls_per_s"]
            p50 = ours["p50_ms"] / theirs["p50_ms"]
            goal = "—"
            if ours["unit"] == "call" and callers == 32:
                goal = "met" if speed >= 3 and p50 <= 1 else "not met"
            # n/a: a run too short for the server's CPU clock (ticks of 10 ms) to move
            cpu = (
                f"{ours['server_cpu_us'] / theirs['server_cpu_us']:.2f}×"
                if theirs["server_cpu_us"]
                else "n/a"
            )
            lines.append(
                f"| {callers} | {ours['path']} | {theirs['path']} | {speed:.2f}× | {p50:.2f}× | {cpu} | {goal} |"
            )
    return lines if len(lines) > 2 else []


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def openenv_server(python: Path, max_sessions: int) -> Iterator[Server]:
    """OpenEnv's echo environment, written by ``openenv init`` into a temporary folder and served
    by uvicorn (one worker) from OpenEnv's own virtual environment, until the block ends."""
    clean = {"PYTHONPATH": "", "ENABLE_WEB_INTERFACE": "false"}  # nothing of ours; no Gradio UI
    with tempfile.TemporaryDirectory() as tmp:
        made = subprocess.run(
            [str(python), "-m", "openenv.cli", "init", "echo_env", "--output-dir", tmp],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp,
            env={**os.environ, **clean},
        )
        if made.returncode != 0 or not (Path(tmp) / "echo_env" / "server").is_dir():
            raise SystemExit(f"`openenv init echo_env` failed:\n{made.stdout[-3000:]}{made.stderr[-3000:]}")
        url = f"http://127.0.0.1:{free_port()}"
        cmd = [str(python), "-c", OPENENV_SERVER, tmp, url.rsplit(":", 1)[1], str(max_sessions)]
        with started(cmd, probe=lambda: healthy(url), timeout_s=180, cwd=tmp, env=clean) as process:
            yield Server("OpenEnv", url, process.proc.pid)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


def versions(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", VERSIONS], capture_output=True, text=True, timeout=120, check=True
    )
    return ", ".join(out.stdout.split("\n")[:5]).strip(", ")


def event_loop() -> asyncio.Runner:
    """The load generator's loop: uvloop where installed (a cheaper client for every path alike),
    unless the client is a plain one (asyncio's own loop)."""
    if not CLIENT.uvloop:
        return asyncio.Runner()
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run: 3,000 calls and 300 episodes per run"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path, interleaved (default 3)")
    parser.add_argument(
        "--callers", default="32,1024", help="concurrent callers, comma separated (default 32,1024)"
    )
    parser.add_argument("--paths", default=ALL_PATHS, help=f"which paths to run (default {ALL_PATHS})")
    parser.add_argument("--calls", type=int, help="calls per run of (a)-(c) (default 20,000; --quick 3,000)")
    parser.add_argument("--episodes", type=int, help="episodes per run of (d) (default 2,000; --quick 300)")
    parser.add_argument(
        "--openenv-python",
        type=Path,
        default=ROOT / ".venv-peers" / "bin" / "python",
        help="python of a virtual environment with openenv==0.10.0 (default .venv-peers/bin/python: `make peers`)",
    )
    parser.add_argument(
        "--client", choices=sorted(CLIENTS), default="tuned", help="the WebSocket client (module docstring)"
    )
    parser.add_argument(
        "--pin", action="store_true", help="servers' threads on CPU 0, the load generator on CPU 1"
    )
    args = parser.parse_args()
    global CLIENT
    CLIENT = CLIENTS[args.client]
    paths, callers = repeats_paths_and_callers(parser, args, ALL_PATHS)
    calls = args.calls or (3000 if args.quick else 20_000)
    episode_count = args.episodes or (300 if args.quick else 2000)

    openenv = args.openenv_python if paths & {"c", "d"} else None
    if openenv is not None and not openenv.exists():
        print(
            f"OpenEnv's python {openenv} is missing: `make peers` makes it (.venv-peers, openenv==0.10.0); "
            "running our paths only",
            file=sys.stderr,
        )
        openenv = None
    peer = versions(openenv) if openenv is not None else None
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        servers = {"ours": stack.enter_context(serve_tree(ROOT, "ours"))}
        if openenv is not None:
            servers["openenv"] = stack.enter_context(openenv_server(openenv, 2 * max(callers) + 16))
        if args.pin:
            for server in servers.values():
                pin(server.pid, {0})
            os.sched_setaffinity(0, {1})
        with event_loop() as runner:
            rows, checked = runner.run(run_all(servers, paths, callers, calls, episode_count, args.repeats))
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=sys.stderr)
    placed = "servers on CPU 0, load generator on CPU 1" if args.pin else "nothing pinned"
    print(
        f"\none call per request — {os.cpu_count()} cores, one uvicorn worker per server, fastest of "
        f"{args.repeats} interleaved runs; OpenEnv: {peer or 'not run'}; client {args.client} "
        f"({CLIENT.what}); {placed}\n"
    )
    print(render(rows))
    print(f"\nanswers checked: {checked:,}, every one the echo of what was sent")


if __name__ == "__main__":
    main()
