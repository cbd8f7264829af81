"""Server cost of one call per WebSocket frame (``GET /v1/stream``) beside one call per POST.

Issue 28 goal 4: a caller that sends one call and waits. ``K`` connections each send a frame
``{"calls": [one echo call]}`` and wait for its answer, ``N`` frames in all; then the same
``N`` calls as one-call ``POST /v1/calls`` on ``K`` keep-alive connections. Connections are
opened before and closed after the measured span: only the calls count. Per frame (per POST),
the server process's

* instructions (the default): the server runs under ``valgrind --tool=callgrind`` with
  instrumentation off until it has served a warm-up; then ``callgrind_control`` zeroes the
  counters, the clients drive the load, and a dump gives the instructions of exactly that span.
  Load on the machine does not change them (``perf stat -e instructions`` would, but this
  machine's VM has no hardware counters: "<not supported>"). User space only: the kernel's
  share of a call (its syscalls) shows in ``--cpu``.
* CPU time (``--cpu``): user + system seconds of the server (``/proc/PID/stat``) over the same
  load without valgrind; moves with the machine's load, so runs repeat (the sides alternating)
  and the lowest counts.

``--ref REF`` serves a git ref's tree (``git archive``) beside this one, the same loads on both.
Every answer is checked (its call id and echoed text), as in bench/peers/single_calls.py.

    python bench/server/stream_cost.py [--frames 3000] [--connections 1,32] [--ref HEAD] [--cpu]
        [--repeats 3] [--keep DIR]

``--keep DIR`` keeps the callgrind dumps (``DIR/<side>.<load>.k<K>.out``) for
``callgrind_annotate``. About a minute for both sides at the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import yaml
from websockets.asyncio.client import ClientConnection

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.git_ref import export_ref  # noqa: E402
from bench.loadgen import Connection, build_post  # noqa: E402
from bench.peers.single_calls import Ours, check_results, open_ws, text_for, ws_url  # noqa: E402
from bench.server.server_throughput import Server, cpu_seconds  # noqa: E402
from tests.support.processes import started  # noqa: E402
from tests.support.server import server_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOADS = ("stream", "post")


@contextlib.contextmanager
def serving(root: Path, name: str, prefix: list[str]) -> Iterator[Server]:
    """``tool-server serve`` of the tree at ``root`` with the tests' light config, behind ``prefix``
    (valgrind's command line, or nothing), on a free loopback port, until the block ends."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(yaml.safe_dump(server_config()))
        cmd = [*prefix, sys.executable, "-m", "tool_server.cli", "serve", "--config", str(config)]
        cmd += ["--host", "127.0.0.1", "--port", "0"]
        with started(cmd, ready_line=r"Uvicorn running on (http://\S+)", timeout_s=600, cwd=root) as process:
            assert process.match is not None
            yield Server(name, process.match.group(1), process.proc.pid)


async def drive_stream(server: Server, connections: int, frames: int, tag: str, span: Span) -> None:
    """``frames`` one-call frames over ``connections`` WebSockets, each waiting for its answer."""
    conns = await asyncio.gather(*(open_ws(ws_url(server.url, Ours.path)) for _ in range(connections)))
    counter = iter(range(frames))

    async def caller(ws: ClientConnection) -> None:
        for i in counter:
            call_id, text = f"{tag}{i}", text_for(i)
            await ws.send(Ours().call_frame(call_id, text))
            check_results(await asyncio.wait_for(ws.recv(), 600), call_id, text)

    try:
        with span:
            await asyncio.gather(*(caller(ws) for ws in conns))
    finally:
        await asyncio.gather(*(ws.close() for ws in conns))


async def drive_posts(server: Server, connections: int, posts: int, tag: str, span: Span) -> None:
    """``posts`` one-call POST /v1/calls on ``connections`` keep-alive connections."""
    url = server.url + "/v1/calls"
    parts = urlsplit(url)
    conns = await asyncio.gather(*(Connection.open(parts.hostname, parts.port) for _ in range(connections)))
    counter = iter(range(posts))

    async def caller(conn: Connection) -> None:
        for i in counter:
            call = {"call_id": f"{tag}{i}", "name": "echo", "arguments": {"text": text_for(i)}}
            status, body = await conn.request(build_post(url, orjson.dumps({"calls": [call]})))
            if status != 200:
                raise RuntimeError(f"POST answered {status}: {body[:300]!r}")
            check_results(body, call["call_id"], text_for(i))

    try:
        with span:
            await asyncio.gather(*(caller(conn) for conn in conns))
    finally:
        for conn in conns:
            conn.close()


class Span(contextlib.AbstractContextManager):
    """The measured part of a load: its connections are opened before it and closed after it,
    so that only the calls count. This one measures nothing (a warm-up)."""

    def __exit__(self, *exc: object) -> None:
        pass


class CpuSpan(Span):
    """The server's CPU seconds over the span."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds = 0.0

    def __enter__(self) -> CpuSpan:
        self.seconds -= cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += cpu_seconds(self.pid)


class CallgrindSpan(Span):
    """Callgrind's counters zeroed at the start, dumped at the end (a file of its own)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> CallgrindSpan:
        callgrind(self.pid, "--zero")
        return self

    def __exit__(self, *exc: object) -> None:
        callgrind(self.pid, "--dump")


def drive(
    load: str, server: Server, connections: int, count: int, tag: str, span: Span | None = None
) -> None:
    work = drive_stream if load == "stream" else drive_posts
    asyncio.run(work(server, connections, count, tag, span or Span()))


def callgrind(pid: int, command: str) -> None:
    subprocess.run(["callgrind_control", command, str(pid)], check=True, capture_output=True, timeout=120)


def instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals line in {dump}")


def measure_instructions(
    root: Path, name: str, connections: list[int], count: int, keep: Path | None
) -> dict[tuple[str, int], float]:
    """Instructions per frame / POST of each load, for the server of the tree at ``root``."""
    figures: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        with serving(root, name, prefix) as server:
            dumps = 0
            for load in LOADS:
                drive(load, server, max(connections), 200, f"warm-{load}-")  # uninstrumented: fast
            callgrind(server.pid, "--instr=on")
            for k in connections:
                for load in LOADS:
                    # Warm the instrumented code (first calls allocate what later ones reuse).
                    drive(load, server, k, max(k, 50), f"w{k}-{load}-")
                    drive(load, server, k, count, f"m{k}-{load}-", CallgrindSpan(server.pid))
                    dumps += 1
                    dump = Path(f"{out}.{dumps}")
                    figures[(load, k)] = instructions(dump) / count
                    if keep is not None:
                        shutil.copy(dump, keep / f"{name.replace(' ', '_')}.{load}.k{k}.out")
    return figures


def measure_cpu(root: Path, name: str, connections: list[int], count: int) -> dict[tuple[str, int], float]:
    """Server CPU µs per frame / POST of each load, without valgrind."""
    figures: dict[tuple[str, int], float] = {}
    with serving(root, name, []) as server:
        for k in connections:
            for load in LOADS:
                drive(load, server, k, max(k, count // 10), f"w{k}-{load}-")
                span = CpuSpan(server.pid)
                drive(load, server, k, count, f"m{k}-{load}-", span)
                figures[(load, k)] = span.seconds / count * 1e6
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=3000, help="frames (and POSTs) per measured load")
    parser.add_argument("--connections", default="1,32", help="caller counts, comma-separated")
    parser.add_argument("--ref", default=None, help="also serve this git ref's tree (e.g. HEAD)")
    parser.add_argument(
        "--cpu", action="store_true", help="CPU time without valgrind instead of instructions"
    )
    parser.add_argument("--repeats", type=int, default=3, help="--cpu: runs per side (the lowest counts)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the callgrind dumps in this folder")
    args = parser.parse_args()
    try:
        connections = [int(k) for k in args.connections.split(",")]
    except ValueError:
        parser.error("--connections takes numbers, e.g. 1,32")
    if min(connections) < 1 or args.frames < 1 or args.repeats < 1:
        parser.error("--connections, --frames and --repeats must be at least 1")
    if not args.cpu and shutil.which("callgrind_control") is None:
        parser.error("valgrind (callgrind_control) is not installed: install it, or measure --cpu")
    sides = [("this tree", REPO)]
    if args.ref is not None:
        sides.append((args.ref, Path(export_ref(args.ref))))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[tuple[str, int], float]] = {}
    if args.cpu:  # the sides alternate, so that the machine's load moves both alike; the lowest counts
        runs: dict[str, list[dict[tuple[str, int], float]]] = {name: [] for name, _ in sides}
        for _ in range(args.repeats):
            for name, root in sides:
                runs[name].append(measure_cpu(root, name, connections, args.frames))
        results = {
            name: {key: min(run[key] for run in done) for key in done[0]} for name, done in runs.items()
        }
    else:
        for name, root in sides:
            results[name] = measure_instructions(root, name, connections, args.frames, args.keep)
    unit = "server CPU µs" if args.cpu else "server instructions"
    print(f"\n{unit} per call, {args.frames} calls per load, one echo call per frame / per POST\n")
    print("| load | callers | " + " | ".join(name for name, _ in sides) + " |")
    print("|---|---:|" + "---:|" * len(sides))
    for k in connections:
        for load in LOADS:
            what = "/v1/stream, 1 call per frame" if load == "stream" else "POST /v1/calls, 1 call per POST"
            cells = [
                f"{results[name][(load, k)]:.1f}" if args.cpu else f"{results[name][(load, k)] / 1000:.1f}k"
                for name, _ in sides
            ]
            print(f"| {what} | {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
