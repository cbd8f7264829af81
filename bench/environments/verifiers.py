"""Verifier throughput in-process: how many verifications per second each built-in does.

The reward is computed for every sampled trajectory (a GRPO batch of 256 prompts x 8
samples is 2,048 verifications per step), so the cheap verifiers must cost microseconds.
Target: ``exact_match`` >= 50,000 verifications/s on one core.

Cases, side by side in one run, each on a pool of distinct requests:

* ``exact_match`` / ``f1``: Search-R1 style responses (think + search + answer tags)
  against ``{"target": [gold, GOLD]}``, half matching; an ASCII and a Unicode variant,
  and 2 KB responses (long reasoning before the answer). A pool of 1,000 requests is
  scored over and over, so golds hit the normal-form cache as a GRPO group's samples
  do; the "every gold new" row scores distinct golds once with the cache cleared;
* ``format``: 3-turn hermes tool-call trajectories;
* ``math_equal`` fast path: integer answers (the arithmetic task), called directly as
  coroutines (no event-loop hop, as the server awaits it);
* ``math_equal`` via math-verify: LaTeX fractions, through the worker subprocesses,
  sequentially and 16 at a time (the first call's worker start-up is excluded).

In-process rows give both wall-clock rates and rates per CPU-second of the measuring
thread (``time.thread_time``): on a shared machine the wall figure drops with other
load, the CPU figure does not. math-verify rows are wall-clock only (the work happens in
worker processes).

Run: ``.venv/bin/python bench/environments/verifiers.py [--seconds 1.0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from protocol import VerifyRequest  # noqa: E402
from tools.verifiers import math as math_module  # noqa: E402
from tools.verifiers.format import format_check  # noqa: E402
from tools.verifiers.match import exact_match, f1  # noqa: E402
from tools.verifiers.math import math_equal  # noqa: E402
from tools.verifiers.text import normalize_gold  # noqa: E402

WORDS = [
    "river",
    "mountain",
    "capital",
    "city",
    "king",
    "queen",
    "battle",
    "treaty",
    "river",
    "island",
    "ocean",
    "desert",
]
UNICODE_WORDS = [
    "São",
    "Paulo",
    "Zürich",
    "Kraków",
    "Łódź",
    "Ελλάδα",
    "Москва",
    "東京",
    "Straße",
    "café",
    "naïve",
]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%d * %d"}}\n</tool_call>'


def search_requests(
    n: int, words: list[str], filler: int, rng: random.Random, unique: bool = False
) -> list[VerifyRequest]:
    requests = []
    for i in range(n):
        gold = " ".join(rng.choices(words, k=2)) + (f" {i}" if unique else "")
        answer = gold if i % 2 == 0 else " ".join(rng.choices(words, k=3))
        reasoning = " ".join(rng.choices(words, k=filler))
        response = (
            f"<think>{reasoning}</think>\n<search>{gold} facts</search>\n"
            f"<think>The results say it.</think>\n<answer>The {answer}.</answer>"
        )
        requests.append(
            VerifyRequest("exact_match", ground_truth={"target": [gold, gold.upper()]}, response=response)
        )
    return requests


def format_requests(n: int, rng: random.Random) -> list[VerifyRequest]:
    requests = []
    for _ in range(n):
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        messages = [
            {"role": "system", "content": "You are a calculator agent."},
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "<think>I need the tool.</think>\n" + CALL % (a, b)},
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": f"<answer>{a * b}</answer>"},
        ]
        requests.append(VerifyRequest("format", messages=messages, arguments={"max_calls": 4}))
    return requests


def number_requests(n: int, rng: random.Random) -> list[VerifyRequest]:
    requests = []
    for i in range(n):
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        answer = a * b if i % 2 == 0 else a * b + 1
        requests.append(
            VerifyRequest("math_equal", ground_truth=a * b, response=f"<answer>{answer:,}</answer>")
        )
    return requests


def latex_requests(n: int, rng: random.Random) -> list[VerifyRequest]:
    requests = []
    for _ in range(n):
        p, q = rng.randint(1, 99), rng.randint(2, 99)
        requests.append(
            VerifyRequest(
                "math_equal", ground_truth=f"\\frac{{{p}}}{{{q}}}", response=f"<answer>{p}/{q}</answer>"
            )
        )
    return requests


Timing = tuple[int, float, float]  # verifications, wall seconds, CPU seconds of this thread


def measure_sync(fn: Callable[[VerifyRequest], Any], requests: list[VerifyRequest], seconds: float) -> Timing:
    """Run the pool over and over for ``seconds`` of CPU time."""
    done, wall, cpu = 0, time.perf_counter(), time.thread_time()
    while True:
        for request in requests:
            fn(request)
        done += len(requests)
        if time.thread_time() - cpu >= seconds:
            return done, time.perf_counter() - wall, time.thread_time() - cpu


def measure_once(fn: Callable[[VerifyRequest], Any], requests: list[VerifyRequest]) -> Timing:
    """One pass over distinct requests with an empty gold cache: every gold is new."""
    normalize_gold.cache_clear()
    wall, cpu = time.perf_counter(), time.thread_time()
    for request in requests:
        fn(request)
    return len(requests), time.perf_counter() - wall, time.thread_time() - cpu


def run_coroutine(coro: Any) -> Any:
    """Drive a coroutine that never suspends (the number fast path) without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the coroutine suspended; use an event loop")


def measure_fast_async(requests: list[VerifyRequest], seconds: float) -> Timing:
    return measure_sync(lambda r: run_coroutine(math_equal(r)), requests, seconds)


def measure_pool(requests: list[VerifyRequest], concurrency: int) -> Timing:
    async def main() -> Timing:
        await math_equal(requests[0])  # start a worker and import sympy outside the timing
        slots = asyncio.Semaphore(concurrency)

        async def one(request: VerifyRequest) -> None:
            async with slots:
                result = await math_equal(request)
                assert result.score == 1.0, result.details

        start = time.perf_counter()
        await asyncio.gather(*(one(r) for r in requests))
        return len(requests), time.perf_counter() - start, float("nan")  # CPU is in the workers

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per in-process case (default 1.0)")
    parser.add_argument("--unique", type=int, default=50_000, help="distinct-gold requests (default 50,000)")
    parser.add_argument(
        "--latex", type=int, default=200, help="math-verify requests per pool case (default 200)"
    )
    args = parser.parse_args()
    rng = random.Random(0)

    ascii_short = search_requests(1000, WORDS, 20, rng)
    unicode_short = search_requests(1000, UNICODE_WORDS, 20, rng)
    ascii_long = search_requests(1000, WORDS, 300, rng)
    ascii_new = search_requests(args.unique, WORDS, 20, rng, unique=True)
    rows: list[tuple[str, str, int, float, float]] = []
    for name, fn in (("exact_match", exact_match), ("f1", f1)):
        for case, requests in (
            ("ASCII, 170 B", ascii_short),
            ("Unicode, 200 B", unicode_short),
            ("ASCII, 2 KB reasoning", ascii_long),
        ):
            rows.append((name, case, *measure_sync(fn, requests, args.seconds)))
        rows.append((name, "ASCII, 170 B, every gold new", *measure_once(fn, ascii_new)))
    rows.append(
        (
            "format",
            "3-turn tool-call trajectory",
            *measure_sync(format_check, format_requests(1000, rng), args.seconds),
        )
    )
    rows.append(
        ("math_equal", "integers (fast path)", *measure_fast_async(number_requests(1000, rng), args.seconds))
    )
    try:
        latex = latex_requests(args.latex, rng)
        rows.append(("math_equal", "LaTeX, math-verify, 1 at a time", *measure_pool(latex, 1)))
        rows.append(("math_equal", "LaTeX, math-verify, 16 at a time", *measure_pool(latex, 16)))
    finally:
        math_module.shutdown_pool()

    print(f"\n{'verifier':<12} {'case':<34} {'n':>8} {'wall/s':>9} {'CPU/s':>9} {'us CPU':>8}")
    print("-" * 84)
    for name, case, n, wall, cpu in rows:
        cpu_rate = f"{n / cpu:>9,.0f}" if cpu == cpu else f"{'-':>9}"
        cpu_us = f"{cpu / n * 1e6:>8.1f}" if cpu == cpu else f"{'-':>8}"
        print(f"{name:<12} {case:<34} {n:>8,} {n / wall:>9,.0f} {cpu_rate} {cpu_us}")
    print(
        "\nwall/s: verifications per wall-clock second (depends on other load); CPU/s: per CPU-second\n"
        "of the measuring thread (one busy core). math-verify rows run in worker processes: wall only."
    )
    _, _, n, wall, cpu = rows[0]
    verdict = "meets" if min(n / wall, n / cpu) >= 50_000 else "MISSES"
    print(
        f"exact_match (ASCII): {n / wall:,.0f}/s wall, {n / cpu:,.0f}/s per CPU-second: {verdict} the 50,000/s target"
    )


if __name__ == "__main__":
    main()
