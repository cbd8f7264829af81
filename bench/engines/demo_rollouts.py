"""Rollouts of the demo tasks with each generation engine, side by side in one run.

    python bench/engines/demo_rollouts.py [--limit 6] [--n 2] [--engines vllm,hf1,hf2] [--compile]

The same workload as ``python -m trainer_client.demo`` (search QA, arithmetic and the bank
environment, SmolLM2-135M-Instruct, temperature 0.7, 96 tokens a turn, 3 turns) through one
real tool server, with:

* ``hf1`` / ``hf2``: the HF backend in this process (float32, as the demo loads it) with
  torch limited to 1 / 2 threads;
* ``vllm``: a vLLM server from .venv-vllm (bfloat16 where the CPU has it natively, else float32: ``cpu_dtype``; eager unless ``--compile``; its start is
  not counted, one request warms it up), reached over HTTP with token ids in and out.

Per engine: wall time of the rollout, model tokens/s (tokens with mask 1 over the wall),
trajectories/min, and the tool server's share of the trajectories' time: the seconds they
spent in tool calls and verification over all their seconds (generation, tools, verify,
client work), summed over trajectories. Load averages are printed: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from trainer_client.backends.models import resolve_model_path  # noqa: E402
from trainer_client.backends.vllm import VLLMGenerator  # noqa: E402
from trainer_client.backends.vllm_server import VLLMServerSettings, cpu_dtype, local_vllm_server  # noqa: E402
from trainer_client.demo import TASKS, build_data, build_parser, run_demo, server_config, tool_server  # noqa: E402

ENGINES = ("hf1", "hf2", "vllm")


def demo_args(limit: int, n: int, engine: str, url: str | None) -> argparse.Namespace:
    args = build_parser().parse_args(["--limit", str(limit), "--n", str(n), "--no-progress"])
    args.tasks = {t.name for t in TASKS}
    args.engine, args.engine_url = ("vllm", url) if engine == "vllm" else ("hf", None)
    return args


def measure(results: dict[str, Any]) -> dict[str, float]:
    records = [r for name, value in results.items() if not name.startswith("_") for r in value["records"]]
    wall = float(results["_wall_s"])
    tokens = sum(sum(r["response_mask"]) for r in records)
    parts = {
        k: sum(float(r["metrics"].get(k, 0.0)) for r in records)
        for k in ("generate_s", "tool_s", "verify_s", "client_s")
    }
    busy = sum(parts.values())
    return {
        "trajectories": len(records),
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "trajectories_per_min": 60.0 * len(records) / wall,
        "tool_share": (parts["tool_s"] + parts["verify_s"]) / busy if busy else 0.0,
        "calls": sum(r["metrics"].get("calls", 0) for r in records),
        "errors": sum(1 for r in records if r.get("error")),
        "load": os.getloadavg()[0],
    }


async def warm_up(url: str) -> None:
    gen = VLLMGenerator(url)
    try:
        await gen.generate("warm-up", prompt_ids=[1, 9690, 198], sampling_params={"max_tokens": 8})
    finally:
        await gen.aclose()


def run_engine(engine: str, args: argparse.Namespace, url: str, data: Path, out: Path) -> dict[str, float]:
    demo = demo_args(args.limit, args.n, engine, None)
    if engine == "vllm":
        settings = VLLMServerSettings(
            resolve_model_path("smollm2"), enforce_eager=not args.compile, dtype=cpu_dtype()
        )
        with local_vllm_server(settings, startup_timeout_s=3600) as server:
            print(f"[{engine}] vLLM ready after {server.started_s:.0f} s", file=sys.stderr, flush=True)
            asyncio.run(warm_up(server.url))
            demo.engine_url = server.url
            return measure(asyncio.run(run_demo(demo, url, data, out)))
    torch.set_num_threads(2 if engine == "hf2" else 1)
    return measure(asyncio.run(run_demo(demo, url, data, out)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=6, help="prompts per task (default 6)")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt (default 2)")
    parser.add_argument(
        "--engines",
        default="vllm,hf1,hf2",
        help=f"comma-separated, run in this order, of {', '.join(ENGINES)}",
    )
    parser.add_argument("--compile", action="store_true", help="vLLM with torch.compile (minutes to start)")
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the vllm/hf1 ratio to bench/results/engines.json (the README's current figures: bench/figures.py)",
    )
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; known: {', '.join(ENGINES)}")

    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = Path(tmp)
        with open(work / "build.log", "w") as log:
            build_data(work / "data", log)
        with tool_server(work / "server.log", config=str(server_config(work))) as url:
            for engine in engines:
                started = os.getloadavg()[0]
                print(f"[{engine}] rolling out (load {started:.1f})", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                rows[engine] = {
                    **run_engine(engine, args, url, work / "data", work / engine),
                    "load_start": started,
                }
                print(f"[{engine}] {rows[engine]}", file=sys.stderr, flush=True)
                print(f"[{engine}] done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    base = rows.get("hf1")
    print(
        f"\ndemo tasks, {args.limit} prompts x {args.n} samples each; vLLM {'compiled' if args.compile else 'eager'}"
    )
    print(
        "| engine | trajectories | wall s | model tokens | tokens/s | trajectories/min | vs hf1 | tool server share | load avg (start-end) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for engine, r in rows.items():
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        print(
            f"| {engine} | {r['trajectories']} | {r['wall_s']:.0f} | {r['tokens']} | {r['tokens_per_s']:.1f} | "
            f"{r['trajectories_per_min']:.1f} | {ratio} | {100 * r['tool_share']:.1f} % | "
            f"{r['load_start']:.1f}-{r['load']:.1f} |"
        )
    if args.record and base and "vllm" in rows:
        _record(args, rows)
    return 0


def _record(args: argparse.Namespace, rows: dict[str, dict[str, float]]) -> None:
    from bench.results import record

    vllm, hf = rows["vllm"], rows["hf1"]
    loads = [r[k] for r in rows.values() for k in ("load_start", "load")]
    path = record(
        "engines",
        "engines/demo_rollouts.py",
        f"engines/demo_rollouts.py --limit {args.limit} --n {args.n}{' --compile' if args.compile else ''} --record",
        [
            {
                "what": "vLLM vs HF generation on the demo tasks",
                "figure": f"{vllm['tokens_per_s']:.1f} vs {hf['tokens_per_s']:.1f} model tokens/s",
                "ratio": f"{vllm['tokens_per_s'] / hf['tokens_per_s']:.1f}×",
                "conditions": f"vLLM {cpu_dtype()} {'compiled' if args.compile else 'eager'} with prefix caching "
                "vs HF float32 on 1 torch thread",
                "section": "Generation engines",
            }
        ],
        load=f"{min(loads):.1f}–{max(loads):.1f}",
        order=6,
    )
    print(f"recorded {path}; run bench/figures.py to update bench/README.md", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
