"""Environment tool calls through ``/v1/calls`` beside a stateless tool, in one run.

One ``tool-server serve`` process serves the stateless ``echo`` tool and a procedural
bank pack (``tools.envs.procedural:pack``, world ``bank``). Batches of ``--batch`` calls
go through the batched HTTP API (the keep-alive load generator of ``loadgen.py``), three
ways, interleaved ``--repeats`` times:

* ``echo``: the stateless baseline;
* ``get_balance``, warm sessions: each call in one of ``--sessions`` sessions that already
  have a world (a trajectory's later calls: the per-session turn queue, the world, the
  output snapshot);
* ``get_balance``, new sessions: every call opens a new session (a trajectory's first call:
  the session and its copy-on-write world are created).

Reported: calls per second and the server process's CPU microseconds per call, and each
as a ratio to ``echo``. Figures in bench/README.md.

    .venv/bin/python bench/environments/env_calls.py [--calls 6400] [--batch 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.loadgen import build_post, run_load  # noqa: E402
from bench.server.server_throughput import cpu_seconds, free_port  # noqa: E402
from tools.envs.procedural import pack  # noqa: E402

PACK_ARGUMENTS = {"world": "bank", "seed": 0, "tasks": 20}


def serve(config: dict) -> tuple[subprocess.Popen[bytes], str]:
    path = Path(tempfile.mkdtemp()) / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready")


def ok(_status: int, body: bytes) -> bool:
    return not any(r.get("is_error") for r in orjson.loads(body)["results"])


async def measure(url: str, pid: int, make, calls: int, batch: int) -> tuple[float, float]:
    """(calls per second, server CPU µs per call) of ``calls`` calls in batches of ``batch``."""
    requests = calls // batch
    before = cpu_seconds(pid)
    result = await run_load(url, make, concurrency=4, total_requests=requests, check=ok)
    if result.errors:
        raise RuntimeError(f"{result.errors} requests failed")
    return requests * batch / result.wall_s, (cpu_seconds(pid) - before) / (requests * batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=6400, help="calls per measurement")
    parser.add_argument("--batch", type=int, default=64, help="calls per POST")
    parser.add_argument("--sessions", type=int, default=256, help="warm sessions")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    accounts = sorted(pack(**PACK_ARGUMENTS).initial_state["accounts"])
    pack_id = pack(**PACK_ARGUMENTS).id
    config = {
        "server": {"log_level": "warning", "shutdown_grace_s": 1},
        "sessions": {"max_sessions": 10 * args.calls * args.repeats + 10_000},
        "tools": [{"target": "tools.testing:echo"}],
        "environments": [{"source": "tools.envs.procedural:pack", "arguments": PACK_ARGUMENTS}],
    }
    proc, url = serve(config)
    round_tag = iter(range(1_000_000))

    def calls_maker(kind: str):
        tag = next(round_tag)

        def make(i: int) -> bytes:
            calls = []
            for j in range(args.batch):
                n = i * args.batch + j
                call = {"call_id": f"{kind}{tag}-{n}", "name": "echo", "arguments": {"text": "hi"}}
                if kind != "echo":
                    session = f"w-{n % args.sessions}" if kind == "warm" else f"n{tag}-{n}"
                    arguments = {"account_id": accounts[n % len(accounts)]}
                    call.update(name="get_balance", arguments=arguments, session=session)
                calls.append(call)
            return build_post(url + "/v1/calls", orjson.dumps({"calls": calls}))

        return make

    async def bench() -> dict[str, list[tuple[float, float]]]:
        rows: dict[str, list[tuple[float, float]]] = {"echo": [], "warm": [], "new": []}
        await measure(url, proc.pid, calls_maker("warm"), args.sessions * 4, args.batch)  # worlds exist
        for kind in rows:  # unmeasured warm-up of each path
            await measure(url, proc.pid, calls_maker(kind), args.batch * 8, args.batch)
        for _ in range(args.repeats):
            for kind in rows:
                rows[kind].append(await measure(url, proc.pid, calls_maker(kind), args.calls, args.batch))
        return rows

    try:
        rows = asyncio.run(bench())
    finally:
        proc.terminate()
        proc.wait(20)
    best = {kind: (max(r[0] for r in runs), min(r[1] for r in runs)) for kind, runs in rows.items()}
    names = {
        "echo": "echo (stateless)",
        "warm": "get_balance, warm sessions",
        "new": "get_balance, new sessions",
    }
    print(
        f"pack {pack_id}; {args.calls} calls x {args.repeats} repeats, batches of {args.batch}, best of the repeats"
    )
    print(f"{'path':<30} {'calls/s':>9} {'server µs/call':>15} {'x echo (CPU)':>13}")
    for kind, (rate, cpu) in best.items():
        print(f"{names[kind]:<30} {rate:>9,.0f} {cpu:>15.1f} {cpu / best['echo'][1]:>12.2f}x")
    print(
        json.dumps(
            {k: {"calls_per_s": round(v[0]), "server_us_per_call": round(v[1], 1)} for k, v in best.items()}
        )
    )


if __name__ == "__main__":
    main()
