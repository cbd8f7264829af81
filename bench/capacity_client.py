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

    .venv/bin/python bench/capacity_client.py --ref 30cbc3e [--rounds 2 --seconds 6]   # ~3 min
    .venv/bin/python bench/capacity_client.py --ref 30cbc3e --quick                    # ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
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
    parser.add_argument("--client", help=argparse.SUPPRESS)  # a client process: its tree
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
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
