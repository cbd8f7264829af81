"""``tool_use`` reward throughput in-process, beside a trivial verifier on the same trajectories.

The ``tool_use`` reward is computed for every sampled trajectory of an environment, so
it must keep up with the trainer: target >= 10,000 verifications/s for 10-call
trajectories on one core. The trivial verifier (``exact_match`` on the final answer:
what a plain QA reward costs) runs on the same requests, side by side, so the ratio
says what the fine-grained reward costs on top of an answer check.

Setup (not timed): a shop pack (products, users, orders; the 4 tools of
``tests/envs/tool_use_shop.py``, 2 of them writes, over 200 products and 50 users),
20 tasks of 8 gold calls each (a user lookup, three parallel product lookups that
depend on it, two orders that depend on those, a tag update, one more read), and for
each task 10 trajectories of 10 calls run through ``Pack.call`` on fresh worlds, the
way the server runs them: the gold calls plus two extra reads, with in turn one
argument changed, the parallel group reordered, an order placed before its lookup, a
failing call, or a parse error. Each request carries the chat a rollout records (one
assistant turn per call group, one tool message per call, an ``<answer>``).

Rows: ``exact_match``; ``score`` in train and eval mode with warm caches (each task's
gold world replayed once, schemas compiled once, and each distinct call's schema check
and argument matching done once: the steady state of a training run, whose GRPO groups
repeat calls); train mode with the per-call cache emptied before each verification
(every call new); and with every cache dropped (the first verification of a task).
Rates per CPU-second of the measuring thread (``time.thread_time``) and per
wall-second, fastest of ``--repeats`` interleaved runs; on a shared machine compare the
CPU column and the ratio.

Run: ``.venv/bin/python bench/environments/tool_use_verify.py [--seconds 2.0] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from protocol import ToolError, VerifyRequest  # noqa: E402
from tests.envs.tool_use_shop import TOOLS  # noqa: E402
from tools.envs.pack import EnvTask, Gold, GoldCall, Pack, PackInfo, call_depths  # noqa: E402
from tools.envs.world import World  # noqa: E402
from tools.verifiers.match import exact_match  # noqa: E402
from tools.verifiers.tool_use import reward as tool_use  # noqa: E402

Case = tuple[Pack, EnvTask, World, VerifyRequest]


def make_pack(rng: random.Random, tasks: int) -> Pack:
    products = {
        f"p{i}": {"name": f"Item {i}", "price": round(rng.uniform(1, 100), 2), "stock": rng.randint(2, 9)}
        for i in range(200)
    }
    users = {f"u{i}": {"name": f"User {i}", "tags": []} for i in range(50)}
    state = {"products": products, "users": users, "orders": {}}
    out = []
    for t in range(tasks):
        user = f"u{t}"
        picks = rng.sample(sorted(products), 4)
        calls = [GoldCall("get_user", {"user_id": user}, id="user")]
        calls += [
            GoldCall("get_product", {"product_id": p}, id=f"look{i}", depends_on=["user"])
            for i, p in enumerate(picks[:3])
        ]
        calls += [
            GoldCall(
                "place_order",
                {"user_id": user, "product_id": picks[i], "quantity": 1 + i},
                id=f"buy{i}",
                depends_on=[f"look{i}"],
                compare=["user_id", "product_id", "quantity"],
            )
            for i in range(2)
        ]
        calls.append(
            GoldCall("set_tags", {"user_id": user, "tags": ["vip", "eu"]}, id="tag", depends_on=["user"])
        )
        calls.append(GoldCall("get_product", {"product_id": picks[3]}, id="extra_look"))
        answer = f"o{1} and o{2}"
        out.append(
            EnvTask(
                f"t{t}",
                [{"role": "user", "content": "shop"}],
                Gold(calls, answer=answer, communicate=["vip"]),
            )
        )
    pack = Pack(PackInfo("bench-shop"), TOOLS, state, out)
    for task in pack.tasks:  # gold outputs, as a pack builder records them (replay runs in depth order)
        depths = call_depths(task.gold.calls)
        replay = pack.replay(task)
        in_order = sorted(task.gold.calls, key=lambda c: depths[c.id])
        for gold, record in zip(in_order, replay.calls, strict=True):
            gold.output = record.output
    return pack


def trajectory(pack: Pack, task: EnvTask, variant: int, rng: random.Random) -> Case:
    """Ten calls: the eight gold calls (perturbed by ``variant``) plus two extra reads."""
    golds = [(c.name, dict(c.arguments)) for c in task.gold.calls]
    turns = [[golds[0]], golds[1:4], golds[4:6], golds[6:8]]
    parse_errors = 0
    if variant == 1:  # one compared argument changed
        turns[2][0] = ("place_order", {**turns[2][0][1], "quantity": 7})
    elif variant == 2:  # the parallel group in another order
        turns[1] = list(reversed(turns[1]))
    elif variant == 3:  # an order before its lookup
        turns = [[golds[0]], [golds[4]], golds[1:4], [golds[5]], golds[6:8]]
    elif variant == 4:  # a failing call
        turns[3].append(("get_product", {"product_id": "nope"}))
    elif variant == 5:
        parse_errors = 1
    extra = [
        ("get_user", {"user_id": f"u{rng.randint(0, 49)}"}),
        ("get_product", {"product_id": f"p{rng.randint(0, 199)}"}),
    ]
    turns.append(extra[: 2 - (variant == 4)])
    world = pack.new_world(task)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "shop"},
    ]
    for group in turns:
        text = "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in group)
        messages.append({"role": "assistant", "content": text})
        for name, arguments in group:
            with contextlib.suppress(ToolError):
                pack.call(world, name, arguments)
            record = world.calls[-1]
            content = json.dumps(record.output) if record.error is None else f"Error: {record.error}"
            messages.append({"role": "tool", "name": name, "content": content})
    if parse_errors:
        messages.append({"role": "assistant", "content": "<tool_call>{oops</tool_call>"})
        messages.append({"role": "tool", "content": "Error: not JSON", "error": "parse"})
    messages.append({"role": "assistant", "content": "Tagged you as vip. <answer>o1 and o2</answer>"})
    request = VerifyRequest("tool_use", ground_truth=task.gold.answer, messages=messages, response_start=2)
    return pack, task, world, request


def measure(fn: Callable[[Case], Any], cases: list[Case], seconds: float) -> tuple[int, float, float]:
    done, wall, cpu = 0, time.perf_counter(), time.thread_time()
    while True:
        for case in cases:
            fn(case)
        done += len(cases)
        if time.thread_time() - cpu >= seconds:
            return done, time.perf_counter() - wall, time.thread_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved runs per row (the fastest is kept)"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    pack = make_pack(rng, tasks=20)
    cases = [trajectory(pack, task, v % 6, rng) for task in pack.tasks for v in range(10)]
    assert all(len(case[2].calls) == 10 for case in cases), "every trajectory makes 10 calls"

    def uncached(case: Case) -> Any:
        tool_use._PACKS[id(case[0])].tasks[case[1].id].facts.clear()  # every call seen for the first time
        return tool_use.score(case[0], case[1], case[2], case[3])

    def cold(case: Case) -> Any:
        tool_use._PACKS.clear()  # the first verification of a task: replay its gold calls, compile schemas
        return tool_use.score(case[0], case[1], case[2], case[3])

    rows: list[tuple[str, Callable[[Case], Any]]] = [
        ("exact_match (trivial)", lambda c: exact_match(c[3])),
        ("tool_use train, warm caches", lambda c: tool_use.score(c[0], c[1], c[2], c[3])),
        ("tool_use eval, warm caches", lambda c: tool_use.score(c[0], c[1], c[2], c[3], mode="eval")),
        ("tool_use train, no call repeats", uncached),
        ("tool_use train, cold (first of a task)", cold),
    ]
    sample = [tool_use.score(*case) for case in cases[:6]]
    print("scores of the six variants of task t0:", [round(r.score, 3) for r in sample])
    best: dict[str, tuple[int, float, float]] = {}
    for _ in range(args.repeats):  # interleaved; a busy neighbour only slows a run down, so keep the fastest
        for name, fn in rows:
            n, wall, cpu = measure(fn, cases, args.seconds)
            if name not in best or n / cpu > best[name][0] / best[name][2]:
                best[name] = (n, wall, cpu)
    print(f"\n{'verifier':<40} {'n':>8} {'CPU/s':>9} {'wall/s':>9} {'us CPU':>8} {'x trivial':>9}")
    print("-" * 88)
    base = None
    for name, _ in rows:
        n, wall, cpu = best[name]
        rate = n / cpu
        base = base or rate
        print(
            f"{name:<40} {n:>8,} {rate:>9,.0f} {n / wall:>9,.0f} {cpu / n * 1e6:>8.1f} {base / rate:>8.1f}x"
        )
    print(
        f"\nfastest of {args.repeats} interleaved runs per row; 'x trivial': CPU per verification / exact_match's."
    )
    print("Target: tool_use >= 10,000 verifications/s per core with warm caches.")


if __name__ == "__main__":
    main()
