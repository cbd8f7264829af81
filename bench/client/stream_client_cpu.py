"""``StreamClient``'s own CPU per call against a raw ``websockets`` client sending the same frames.

One real replica (``tool-server serve``) in its own process; then client processes, one at a
time, the sides interleaved (their order reversed every other round). Each runs ``--callers``
closed-loop callers, each awaiting one echo call at a time, over ONE WebSocket to
``/v1/stream``, until ``--calls`` calls are answered (after a tenth of that as warm-up), and
reports its own CPU (user + system, ``getrusage``) per answered call. Sides:

* ``stream``: this tree's ``StreamClient`` (``await client.call("echo", {"text": ...})``);
* ``ref``: the same with ``StreamClient`` from ``git archive REF`` (``--ref``);
* ``raw``: the floor for a client that shares one connection between callers: a ``websockets``
  connection opened as ``StreamClient`` opens it (no compression, no size limit), the same
  frames (``{"calls": [{"call_id", "name", "arguments"}]}``, orjson, binary), one reader
  matching answers to futures by ``call_id`` and nothing else: no deadline, no resend, no
  ``Result`` object;
* ``raw-conns``: the same frames on a connection per caller (as ``peers/single_calls.py`` (b)
  drives the stream): each caller sends and then reads its own connection's answer.

Every answer is checked on every side (its text is the one sent). The event loop is asyncio's
default (``--uvloop``: uvloop's), the same for every side. Prints per side and caller count the
lowest and the range of client µs per call, p50 latency, and the ratios stream/raw (ref/raw).

``--instructions``: instead of CPU time, the client's instructions per call (user space only),
one run per side under ``valgrind --tool=callgrind``, instrumentation on for the measured calls
only (``callgrind_control`` while the client waits between warm-up and measure): the machine's
load does not change them. Under valgrind the client is ~50x slower than the server, so answers
come in bunches (as when the client is the limit); the kernel's share (system calls) is not in
them. About a minute per side and caller count at ``--calls 4000``.

    .venv/bin/python bench/client/stream_client_cpu.py [--callers 32,1024] [--calls 20000]
        [--rounds 3] [--ref REF] [--uvloop] [--instructions]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Mismatch(RuntimeError):
    """An answer that is not the echo of what was sent: the figures would not hold."""


async def drive(call: Any, callers: int, warmup: int, total: int, gate: bool = False) -> dict[str, Any]:
    """``callers`` loops of ``await call(text)`` (which checks its answer): ``warmup`` calls,
    then ``total`` timed ones; the process's CPU over the timed ones. ``gate``: say "warm" and
    "measured" on stdout and wait for a line on stdin after each (the parent switches
    callgrind's instrumentation meanwhile)."""
    latencies: list[float] = []

    async def phase(count: int, keep: bool) -> None:
        counter = iter(range(count))

        async def caller() -> None:
            for i in counter:
                t0 = time.perf_counter()
                await call(f"t{i:011d}")
                if keep:
                    latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(caller() for _ in range(callers)))

    await phase(warmup, keep=False)
    if gate:
        wait_for_parent("warm")
    times0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await phase(total, keep=True)
    times, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    if gate:
        wait_for_parent("measured")
    user, system = times.ru_utime - times0.ru_utime, times.ru_stime - times0.ru_stime
    calls = max(1, len(latencies))
    return {
        "calls": len(latencies),
        "client_us": (user + system) / calls * 1e6,
        "system_us": system / calls * 1e6,  # the kernel's share: mostly sending on loopback
        "calls_per_s": len(latencies) / wall,
        "p50_ms": percentile(latencies, 0.5) * 1000,
    }


def wait_for_parent(stage: str) -> None:
    print(stage, flush=True)
    sys.stdin.readline()  # blocks the event loop on purpose: nothing runs while it is switched


async def stream_side(
    url: str, tree: str, callers: int, warmup: int, total: int, gate: bool = False
) -> dict[str, Any]:
    sys.path.insert(0, tree)
    from trainer_client.client.stream import StreamClient  # noqa: PLC0415 (from the side's tree)

    async with StreamClient(url) as client:

        async def call(text: str) -> None:
            result = await client.call("echo", {"text": text})
            if result.is_error or result.structured["text"] != text:
                raise Mismatch(f"{text!r} answered {result!r}")

        return await drive(call, callers, warmup, total, gate)


async def raw_side(url: str, callers: int, warmup: int, total: int, gate: bool = False) -> dict[str, Any]:
    import orjson  # noqa: PLC0415
    from websockets.asyncio.client import connect  # noqa: PLC0415

    ws_url = "ws" + url.removeprefix("http") + "/v1/stream"
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
    ids = itertools.count()
    prefix = f"raw-{os.urandom(6).hex()}-"  # the server keeps answers by call_id: fresh ids every run
    loop = asyncio.get_running_loop()
    async with connect(ws_url, compression=None, max_size=None) as ws:

        async def read() -> None:
            async for message in ws:
                for item in orjson.loads(message)["results"]:
                    future = waiting.pop(item["call_id"], None)
                    if future is not None:
                        future.set_result(item)

        async def call(text: str) -> None:
            call_id = f"{prefix}{next(ids)}"
            future = waiting[call_id] = loop.create_future()
            frame = {"calls": [{"call_id": call_id, "name": "echo", "arguments": {"text": text}}]}
            await ws.send(orjson.dumps(frame))
            item = await future
            if item.get("is_error") or item["structured"]["text"] != text:
                raise Mismatch(f"{text!r} answered {item!r}")

        reader = asyncio.create_task(read())
        try:
            return await drive(call, callers, warmup, total, gate)
        finally:
            reader.cancel()


async def raw_conns_side(
    url: str, callers: int, warmup: int, total: int, gate: bool = False
) -> dict[str, Any]:
    import orjson  # noqa: PLC0415
    from websockets.asyncio.client import connect  # noqa: PLC0415

    ws_url = "ws" + url.removeprefix("http") + "/v1/stream"
    ids = itertools.count()
    prefix = f"rawc-{os.urandom(6).hex()}-"
    free = list(
        await asyncio.gather(*(connect(ws_url, compression=None, max_size=None) for _ in range(callers)))
    )
    connections = list(free)

    async def call(text: str) -> None:
        ws = free.pop()  # one per caller: each caller has one call in flight
        try:
            call_id = f"{prefix}{next(ids)}"
            frame = {"calls": [{"call_id": call_id, "name": "echo", "arguments": {"text": text}}]}
            await ws.send(orjson.dumps(frame))
            (item,) = orjson.loads(await ws.recv())["results"]
        finally:
            free.append(ws)
        if item["call_id"] != call_id or item.get("is_error") or item["structured"]["text"] != text:
            raise Mismatch(f"{text!r} answered {item!r}")

    try:
        return await drive(call, callers, warmup, total, gate)
    finally:
        await asyncio.gather(*(ws.close() for ws in connections))


def client_main(args: argparse.Namespace) -> None:
    warmup = max(args.callers, args.calls // 10)
    if args.side == "raw-conns":
        work = raw_conns_side(args.url, args.callers, warmup, args.calls, args.gate)
    elif args.side == "raw":
        work = raw_side(args.url, args.callers, warmup, args.calls, args.gate)
    else:
        work = stream_side(args.url, args.tree, args.callers, warmup, args.calls, args.gate)
    if args.uvloop:
        import uvloop  # noqa: PLC0415

        out = uvloop.run(work)
    else:
        out = asyncio.run(work)
    print(json.dumps(out), flush=True)


def run_side(side: str, tree: str, url: str, callers: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--side", side, "--tree", tree, "--url", url]
    command += ["--callers", str(callers), "--calls", str(args.calls)]
    command += ["--uvloop"] if args.uvloop else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} client failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_instructions(
    side: str, tree: str, url: str, callers: int, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """One client under callgrind, instrumented for its measured calls only: instructions per call."""
    out = tmp / f"cg.{side}.{callers}.{len(list(tmp.iterdir()))}.out"
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    command += [sys.executable, __file__, "--side", side, "--tree", tree, "--url", url, "--gate"]
    command += ["--callers", str(callers), "--calls", str(args.calls)]
    command += ["--uvloop"] if args.uvloop else []
    with (tmp / "valgrind.log").open("a") as log:
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for stage, control in (("warm", "--instr=on"), ("measured", "--dump")):
                line = proc.stdout.readline().strip()
                if line != stage:
                    raise RuntimeError(
                        f"the {side} client said {line!r}, not {stage!r}: see {tmp}/valgrind.log"
                    )
                subprocess.run(
                    ["callgrind_control", control, str(proc.pid)],
                    check=True,
                    capture_output=True,
                    timeout=300,
                )
                proc.stdin.write("\n")
                proc.stdin.flush()
            result = json.loads(proc.stdout.readline())
        finally:
            proc.stdin.close()
            proc.wait(timeout=300)
    dump = Path(f"{out}.1")
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return {**result, "instructions": int(line.split()[1]) / max(1, result["calls"])}
    raise RuntimeError(f"no totals line in {dump}")


def instructions_bench(args: argparse.Namespace, sides: dict[str, str], callers_list: list[int]) -> None:
    from tests.support.server import running_server, server_config  # noqa: PLC0415

    if shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (callgrind_control) is not installed")
    figures: dict[tuple[int, str], dict[str, Any]] = {}
    loads = [os.getloadavg()[0]]
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_server(server_config(limits={"max_concurrency": 4096})) as server,
    ):
        for callers in callers_list:
            for side in sides:
                kind = side if side != "ref" else "stream"
                figures[(callers, side)] = run_instructions(
                    kind, sides[side], server.url, callers, args, Path(tmp)
                )
                loads.append(os.getloadavg()[0])
                print(
                    f"  {side} x{callers}: {figures[(callers, side)]['instructions'] / 1000:.1f}k instructions/call",
                    file=sys.stderr,
                    flush=True,
                )
    loop = "uvloop" if args.uvloop else "asyncio's default loop"
    print(
        f"StreamClient instructions per call (callgrind, user space), one connection, {loop}: "
        f"{args.calls:,} calls per side after a warm-up; load average {min(loads):.1f}-{max(loads):.1f} (1 min)"
    )
    print("| callers | side | client instructions/call | ratio to raw |")
    print("|---:|---|---:|---:|")
    for callers in callers_list:
        raw = figures[(callers, "raw")]["instructions"]
        for side in sides:
            mine = figures[(callers, side)]["instructions"]
            print(f"| {callers} | {side} | {mine / 1000:.1f}k | {mine / raw:.2f}× |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", default="32,1024", help="caller counts, comma separated")
    parser.add_argument("--calls", type=int, default=20_000, help="calls measured per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side and caller count")
    parser.add_argument("--ref", help="also a git ref's StreamClient (e.g. before a change)")
    parser.add_argument("--uvloop", action="store_true", help="uvloop's event loop in every client")
    parser.add_argument(
        "--instructions", action="store_true", help="instructions per call under callgrind, not CPU time"
    )
    parser.add_argument("--gate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)  # a client process: stream or raw
    parser.add_argument("--tree", default=str(REPO), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        args.callers = int(args.callers)
        client_main(args)
        return

    sys.path.insert(0, str(REPO))
    from bench.git_ref import export_ref  # noqa: PLC0415
    from tests.support.server import running_server, server_config  # noqa: PLC0415

    sides = {"stream": str(REPO), "raw": str(REPO), "raw-conns": str(REPO)}
    if args.ref:
        sides["ref"] = export_ref(args.ref, "trainer_client", "protocol")
    callers_list = [int(c) for c in args.callers.split(",")]
    if args.instructions:
        try:
            instructions_bench(args, sides, callers_list)
        finally:
            if "ref" in sides:
                shutil.rmtree(sides["ref"], ignore_errors=True)
        return
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    loads = [os.getloadavg()[0]]
    try:
        with running_server(server_config(limits={"max_concurrency": 4096})) as server:
            for round_ in range(args.rounds):
                for callers in callers_list:
                    order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                    for side in order:
                        run = run_side(
                            side if side != "ref" else "stream", sides[side], server.url, callers, args
                        )
                        results.setdefault((callers, side), []).append(run)
                        loads.append(os.getloadavg()[0])
                        print(
                            f"  {side} x{callers}: {run['client_us']:.1f} µs/call, "
                            f"{run['calls_per_s']:,.0f} calls/s, load {loads[-1]:.1f}",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        if "ref" in sides:
            shutil.rmtree(sides["ref"], ignore_errors=True)
    loop = "uvloop" if args.uvloop else "asyncio's default loop"
    print(
        f"StreamClient CPU per call, one connection, {loop}: lowest of {args.rounds} interleaved runs "
        f"of {args.calls:,} calls per side; load average {min(loads):.1f}-{max(loads):.1f} (1 min)"
    )
    print("| callers | side | client µs/call (range) | of which system | calls/s | p50 ms | ratio to raw |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for callers in callers_list:
        raw = min(r["client_us"] for r in results[(callers, "raw")])
        for side in sides:
            runs = results[(callers, side)]
            best = min(runs, key=lambda r: r["client_us"])
            spread = f"{min(r['client_us'] for r in runs):.1f}-{max(r['client_us'] for r in runs):.1f}"
            print(
                f"| {callers} | {side} | **{best['client_us']:.1f}** ({spread}) | {best['system_us']:.1f} "
                f"| {best['calls_per_s']:,.0f} "
                f"| {best['p50_ms']:.2f} | {best['client_us'] / raw:.2f}× |"
            )


if __name__ == "__main__":
    main()
