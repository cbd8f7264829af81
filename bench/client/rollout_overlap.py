"""Rollout overlap: does one slow tool or one long trajectory hold the others back?

64 trajectories with a seeded workload run against a real tool server on loopback,
through the real ``ToolClient``, ``RolloutCore`` (parse, render, splice with the
SmolLM2 tokenizer) and the server's ``sleep`` tool. Generation is played by the
scripted generator (50-300 ms per turn) behind the same backend interface a real
engine uses. Side by side, on the same workload in one run:

* **ideal critical path**: the longest single trajectory's own generation + tool time
  (nominal workload values): no schedule can finish sooner;
* **ours**: ``RolloutCore.run_batch``, every trajectory at its own pace;
* **turn-synchronous**: each turn all active trajectories generate and wait for the
  slowest, then all their tool calls run concurrently and wait for the slowest;
* **one at a time**: every tool call (and generation) waits for the previous one.
  Computed, not run (it would take minutes): the sum of all nominal generation and
  tool times plus the measured round-trip overhead of each call (median of sequential
  ``sleep(0)`` calls). ``--run-sequential`` runs it for real instead. A second row
  serialises only the tool calls (generation concurrent): the sum of tool times.

Also: client CPU per turn (parse + render + splice) for a 500-token observation, and
4,096 concurrent calls from one client (errors must be zero).

Run: ``.venv/bin/python bench/client/rollout_overlap.py [--seed 0] [--trajectories 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from protocol import Call, new_call_id  # noqa: E402
from tests.support.server import running_server  # noqa: E402
from trainer_client.backends.models import load_tokenizer  # noqa: E402
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn  # noqa: E402
from trainer_client.client.tool_client import ToolClient  # noqa: E402
from trainer_client.parsers.registry import get_parser  # noqa: E402
from trainer_client.rollout.core import RolloutConfig, RolloutCore, Task  # noqa: E402
from trainer_client.templates.factory import make_renderer  # noqa: E402


@dataclass(frozen=True)
class Plan:
    """One trajectory's workload: generation delay per turn, sleep seconds per tool turn."""

    gen_s: tuple[float, ...]  # len(sleep_s) + 1: the last turn writes the answer
    sleep_s: tuple[float, ...]

    @property
    def nominal_s(self) -> float:
        return sum(self.gen_s) + sum(self.sleep_s)


def make_workload(
    seed: int,
    n: int = 64,
    *,
    min_tool_turns: int = 1,
    max_tool_turns: int = 6,
    median_s: float = 0.3,
    sigma: float = 0.9,
    cap_s: float = 10.0,
    gen_range_s: tuple[float, float] = (0.05, 0.3),
) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for _ in range(n):
        k = rng.randint(min_tool_turns, max_tool_turns)
        sleeps = tuple(round(min(cap_s, rng.lognormvariate(math.log(median_s), sigma)), 4) for _ in range(k))
        gens = tuple(rng.uniform(*gen_range_s) for _ in range(k + 1))
        plans.append(Plan(gens, sleeps))
    return plans


def task_for(i: int) -> Task:
    return Task(messages=[{"role": "user", "content": f"Trajectory {i}: run the tools you are given."}])


class Scripts:
    """Token scripts for the scripted generator, keyed by each trajectory's prompt ids."""

    def __init__(self, tokenizer: Any, renderer: Any, plans: list[Plan]) -> None:
        eos = tokenizer.eos_token_id
        self.by_prompt: dict[tuple[int, ...], list[ScriptedTurn]] = {}
        encode = renderer.codec.encode
        for i, plan in enumerate(plans):
            turns = [
                ScriptedTurn(
                    encode(
                        f'<tool_call>\n{{"name": "sleep", "arguments": {{"seconds": {s}}}}}\n</tool_call>'
                    ),
                    delay_s=g,
                )
                for g, s in zip(plan.gen_s, plan.sleep_s, strict=False)
            ]
            turns.append(ScriptedTurn(encode("<answer>done</answer>") + [eos], delay_s=plan.gen_s[-1]))
            prompt = tuple(renderer.prompt_ids(task_for(i).messages))
            self.by_prompt[prompt] = turns

    def __call__(self, prompt_ids: list[int]) -> list[ScriptedTurn]:
        return self.by_prompt[tuple(prompt_ids)]


def rollout_config(max_tool_turns: int) -> RolloutConfig:
    return RolloutConfig(
        format="hermes",
        max_turns=max_tool_turns + 2,
        max_calls_per_turn=1,
        max_obs_tokens=512,
        response_length=32768,
    )


# ----------------------------------------------------------------------------- runs


async def run_ours(url: str, tokenizer: Any, plans: list[Plan], max_tool_turns: int) -> dict[str, Any]:
    async with ToolClient(url) as client:
        core = make_core(tokenizer, plans, client, max_tool_turns)
        started = time.perf_counter()
        trajectories = await core.run_batch([task_for(i) for i in range(len(plans))])
        wall = time.perf_counter() - started
        metrics = client.metrics()
    return {"wall_s": wall, "trajectories": trajectories, "client": metrics}


def make_core(tokenizer: Any, plans: list[Plan], client: ToolClient, max_tool_turns: int) -> RolloutCore:
    renderer = make_renderer(tokenizer)
    generator = ScriptedGenerator(
        Scripts(tokenizer, renderer, plans), tokenizer=tokenizer, eos_token_ids=[tokenizer.eos_token_id]
    )
    return RolloutCore(tokenizer, generator, client, rollout_config(max_tool_turns), renderer=renderer)


async def run_turn_synchronous(url: str, tokenizer: Any, plans: list[Plan]) -> float:
    """Lock-step turns over the same components: generate all, wait; call all, wait."""
    renderer = make_renderer(tokenizer)
    parser = get_parser("hermes")
    generator = ScriptedGenerator(
        Scripts(tokenizer, renderer, plans), tokenizer=tokenizer, eos_token_ids=[tokenizer.eos_token_id]
    )
    params = {"temperature": 1.0, "stop": list(parser.stop_strings), "logprobs": True, "max_tokens": 4096}
    contexts = {i: renderer.prompt_ids(task_for(i).messages) for i in range(len(plans))}
    async with ToolClient(url) as client:
        started = time.perf_counter()
        while contexts:
            active = sorted(contexts)
            outputs = await asyncio.gather(
                *(
                    generator.generate(f"sync-{i}", prompt_ids=contexts[i], sampling_params=params)
                    for i in active
                )
            )
            pending: list[tuple[int, list[int], Call]] = []
            for i, output in zip(active, outputs, strict=True):
                turn_ids = list(output.token_ids)
                outcome = parser.parse(renderer.codec.decode(turn_ids))
                if outcome.final_answer is not None or not outcome.calls:
                    del contexts[i]
                    continue
                contexts[i] = contexts[i] + turn_ids
                parsed = outcome.calls[0]
                pending.append((i, turn_ids, Call(new_call_id(), parsed.name, parsed.arguments)))
            if pending:
                results = await client.call_tools([call for _, _, call in pending])
                for (i, turn_ids, call), result in zip(pending, results, strict=True):
                    observation = [{"role": "tool", "name": call.name, "content": result.text}]
                    contexts[i] = contexts[i] + renderer.splice(observation, turn_ids).ids
        return time.perf_counter() - started


async def run_sequential(url: str, tokenizer: Any, plans: list[Plan], max_tool_turns: int) -> float:
    """One trajectory after another, each call waiting for the previous one (for real)."""
    async with ToolClient(url) as client:
        core = make_core(tokenizer, plans, client, max_tool_turns)
        started = time.perf_counter()
        for i in range(len(plans)):
            await core.run(task_for(i))
        return time.perf_counter() - started


async def call_overhead_s(url: str, n: int = 50) -> float:
    """Median round trip of a sequential ``sleep(0)`` call: the per-call cost beyond the tool."""
    async with ToolClient(url) as client:
        await client.call("sleep", {"seconds": 0})
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            result = await client.call("sleep", {"seconds": 0})
            samples.append(time.perf_counter() - started)
            assert not result.is_error, result
    return statistics.median(samples)


async def run_concurrent_calls(url: str, n: int = 4096) -> dict[str, Any]:
    async with ToolClient(url) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(client.call_tools([Call(new_call_id(), "echo", {"text": str(i)})]) for i in range(n))
        )
        wall = time.perf_counter() - started
        metrics = client.metrics()
    errors = sum(1 for (r,) in results if r.is_error) + sum(metrics["errors"].values())
    return {"wall_s": wall, "errors": errors, "batches": metrics["batches"], "metrics": metrics}


def turn_cpu_ms(tokenizer: Any, iterations: int = 400) -> dict[str, float]:
    """Client CPU of one turn: decode + parse the model turn, render + splice a 500-token result."""
    renderer = make_renderer(tokenizer)
    parser = get_parser("hermes")
    codec = renderer.codec
    turn_ids = codec.encode(
        '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'
    )
    words = [
        "Paris",
        "is",
        "the",
        "capital",
        "and",
        "most",
        "populous",
        "city",
        "of",
        "France",
        ",",
        "with",
        "an",
        "estimated",
        "population",
    ]
    rng = random.Random(0)
    texts = []
    for k in range(iterations):
        ids = codec.encode(" ".join(rng.choice(words) for _ in range(700)))[:495]
        texts.append(f"Doc {k}: " + codec.decode(ids))
    sizes = []
    for _ in range(2):  # warm the prefix cache, as a running rollout has
        renderer.splice([{"role": "tool", "name": "search", "content": texts[0]}], turn_ids)
    started = time.perf_counter()
    for text in texts:  # distinct texts: the observation memo never hits
        parsed = parser.parse(codec.decode(turn_ids))
        assert parsed.calls
        splice = renderer.splice([{"role": "tool", "name": "search", "content": text}], turn_ids)
        sizes.append(len(splice.observation_ids))
    per_turn = (time.perf_counter() - started) / iterations
    return {"ms_per_turn": per_turn * 1000.0, "observation_tokens": statistics.mean(sizes)}


# ----------------------------------------------------------------------------- report


def _row(name: str, seconds: float, ideal: float, ours: float, how: str) -> tuple[str, str, str, str, str]:
    return (name, f"{seconds:8.2f}", f"{seconds / ideal:6.2f}x", f"{seconds / ours:6.2f}x", how)


def print_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for n, row in enumerate([header, *rows]):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


async def main_async(args: argparse.Namespace) -> int:
    plans = make_workload(args.seed, args.trajectories, max_tool_turns=args.max_tool_turns)
    ideal = max(p.nominal_s for p in plans)
    n_calls = sum(len(p.sleep_s) for p in plans)
    tokenizer = load_tokenizer("smollm2")
    print(
        f"workload: seed {args.seed}, {len(plans)} trajectories, {n_calls} tool calls, "
        f"tool time median {statistics.median(s for p in plans for s in p.sleep_s):.3f} s, "
        f"max {max(s for p in plans for s in p.sleep_s):.2f} s"
    )
    with running_server() as server:
        url = server.url
        # Warm-up, untimed: template compilation, tokenizer caches, server code paths and
        # HTTP connections, as in a rollout that has been running for a while.
        warm = make_workload(args.seed + 1, 16, cap_s=0.2, gen_range_s=(0.01, 0.05))
        await run_ours(url, tokenizer, warm, args.max_tool_turns)
        await call_overhead_s(url, 5)
        ours = await run_ours(url, tokenizer, plans, args.max_tool_turns)
        sync_wall = await run_turn_synchronous(url, tokenizer, plans)
        overhead = await call_overhead_s(url)
        sequential_real = (
            await run_sequential(url, tokenizer, plans, args.max_tool_turns) if args.run_sequential else None
        )
        burst = await run_concurrent_calls(url, args.concurrent_calls)
    cpu = turn_cpu_ms(tokenizer)

    trajectories = ours["trajectories"]
    failed = [t for t in trajectories if t.error or t.metrics.get("tool_errors")]
    wall = ours["wall_s"]
    measured_critical = max(t.metrics["generate_s"] + t.metrics["tool_s"] for t in trajectories)
    turns = sum(t.metrics["assistant_turns"] for t in trajectories)
    client_cpu_ms = 1000.0 * sum(t.metrics["client_s"] for t in trajectories) / max(1, turns)
    sequential_computed = sum(p.nominal_s for p in plans) + n_calls * overhead
    tools_serial = sum(sum(p.sleep_s) for p in plans) + n_calls * overhead

    print()
    rows = [
        _row("ideal critical path", ideal, ideal, wall, "longest trajectory, nominal gen + tool time"),
        _row("ours (RolloutCore + ToolClient)", wall, ideal, wall, "measured"),
        _row("turn-synchronous batches", sync_wall, ideal, wall, "measured"),
    ]
    if sequential_real is not None:
        rows.append(_row("one at a time", sequential_real, ideal, wall, "measured (--run-sequential)"))
    rows.append(
        _row(
            "one at a time",
            sequential_computed,
            ideal,
            wall,
            f"computed: sum of nominal times + {n_calls} x {overhead * 1000:.2f} ms measured call overhead",
        )
    )
    rows.append(
        _row(
            "tool calls serialised only", tools_serial, ideal, wall, "computed: sum of tool times + overhead"
        )
    )
    print_table(rows, ("schedule", "wall s", "/ideal", "/ours", "how"))

    one_at_a_time = sequential_real if sequential_real is not None else sequential_computed
    checks = [
        ("wall / ideal", wall / ideal, "<= 1.15", wall / ideal <= 1.15),
        ("turn-synchronous / ours", sync_wall / wall, ">= 1.8", sync_wall / wall >= 1.8),
        ("one at a time / ours", one_at_a_time / wall, ">= 15", one_at_a_time / wall >= 15),
        ("client CPU per turn, 500-token obs (ms)", cpu["ms_per_turn"], "<= 0.5", cpu["ms_per_turn"] <= 0.5),
        ("4096 concurrent calls: errors", float(burst["errors"]), "== 0", burst["errors"] == 0),
    ]
    print()
    print_table(
        [(name, f"{value:.3f}", target, "ok" if ok else "MISSED") for name, value, target, ok in checks],
        ("figure", "value", "target", ""),
    )
    client = ours["client"]
    print()
    longest = max(
        range(len(plans)),
        key=lambda i: trajectories[i].metrics["generate_s"] + trajectories[i].metrics["tool_s"],
    )
    lm, lp = trajectories[longest].metrics, plans[longest]
    print(
        f"measured critical path: {measured_critical:.2f} s (trajectory {longest}: generation "
        f"{lm['generate_s']:.2f} s vs {sum(lp.gen_s):.2f} nominal, tools {lm['tool_s']:.2f} s vs "
        f"{sum(lp.sleep_s):.2f} nominal, {len(lp.sleep_s)} calls)"
    )
    print(f"trajectories with errors: {len(failed)} of {len(trajectories)}")
    print(
        f"client: {client['calls']} calls in {client['batches']} POSTs (mean {client['mean_batch_size']}), "
        f"retries {client['retries']}, split POSTs {client['split_posts']}, call latency ms {client['latency_ms']}"
    )
    print(
        f"client CPU per turn inside the rollout (decode + parse + render + splice, short observations): "
        f"{client_cpu_ms:.3f} ms over {turns} turns"
    )
    print(
        f"CPU per turn with a {cpu['observation_tokens']:.0f}-token observation: {cpu['ms_per_turn']:.3f} ms "
        "(decode + parse the model turn, render + splice the observation)"
    )
    print(
        f"4096 concurrent echo calls: {burst['wall_s']:.2f} s wall, {burst['batches']} POSTs, "
        f"{burst['errors']} errors, latency ms {burst['metrics']['latency_ms']}"
    )
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--trajectories", type=int, default=64, help="number of trajectories (default 64)")
    parser.add_argument(
        "--max-tool-turns", type=int, default=6, help="tool turns per trajectory: 1..N (default 6)"
    )
    parser.add_argument(
        "--concurrent-calls", type=int, default=4096, help="size of the burst run (default 4096)"
    )
    parser.add_argument(
        "--run-sequential",
        action="store_true",
        help="also run the one-at-a-time schedule for real (takes minutes) instead of only computing it",
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
