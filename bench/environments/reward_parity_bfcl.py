"""Reward parity with BFCL on every task: our served eval-mode reward vs BFCL's own checker.

A real server (``tool-server serve``) serves the four BFCL multi-turn packs. Every task's
gold is perturbed into non-gold trajectories of many kinds (``tests/envs/bfcl/parity.py``:
a call dropped, repeated or taken from another turn, two swapped, one moved to the next or
previous turn, an argument changed in value, case or format, an integer sent as a float, a
default spelled out or left out, a list reversed, an unknown tool, a turn left empty, the
conversation stopped early). Each plays in its own session through ``/v1/calls`` and is
scored by ``/v1/verify`` (``tool_use``, eval mode) and by BFCL's evaluation
(``multi_turn_checker``, which ``eval``s the call strings of our own perturbed gold).

Printed per category and per kind: trajectories, how many BFCL passes, disagreements of our
reward with BFCL's (target 0), and for comparison the disagreements of the reward before
BFCL's verdict was its eval reward (the product of the ``calls`` and ``state`` components,
still returned). Then the named difference (``schema_refused``: an integer sent as a string,
which our server refuses and BFCL runs): how often BFCL's verdict on the trajectory it would
have run differs from its verdict on the one that ran. Then BFCL's leaderboard line for the
gold (100 %). Figures in bench/README.md and docs/environments.md.

    .venv/bin/python bench/environments/reward_parity_bfcl.py [--every 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.envs.bfcl.parity import (  # noqa: E402
    UNKNOWN_TOOL,
    Call,
    Trajectory,
    bfcl_verdict,
    perturbations,
    schema_refused,
    served,
)
from tests.support.server import running_server, server_config  # noqa: E402
from tools.envs.bfcl import packs as bfcl  # noqa: E402
from tools.envs.bfcl.data import CATEGORIES, entries  # noqa: E402
from tools.envs.bfcl.leaderboard import leaderboard  # noqa: E402

PREFIXES = {
    "multi_turn_base": "",
    "multi_turn_miss_func": "mf_",
    "multi_turn_miss_param": "mp_",
    "multi_turn_long_context": "lc_",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="score every n-th task (1: all 200 a category)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--categories", nargs="*", default=list(CATEGORIES))
    args = parser.parse_args()
    environments = [
        {"source": "tools.envs.bfcl:pack", "arguments": {"category": c}, "prefix": PREFIXES[c]}
        for c in args.categories
    ]
    totals: Counter[str] = Counter()
    gold_rows = []
    with (
        running_server(server_config(tools=[], environments=environments)) as server,
        served(server.url, {f"bfcl_{c}": p for c, p in PREFIXES.items()}) as player,
    ):
        for category in args.categories:
            started = time.perf_counter()
            pack = bfcl.pack(category)
            by_id = {e.id: e for e in entries(category)}
            rng = random.Random(f"{args.seed}-{category}")
            count: dict[str, Counter[str]] = defaultdict(Counter)
            examples: list[str] = []
            tasks = pack.tasks[:: args.every]
            for task in tasks:
                entry = by_id[task.id]
                for trajectory in perturbations(pack, task, rng):
                    valid, error = bfcl_verdict(entry, category, trajectory)
                    result = player.verdict(pack, task, trajectory)
                    c = result["components"]
                    row = count[trajectory.kind]
                    row["n"] += 1
                    row["bfcl_pass"] += valid
                    disagrees = result["score"] != float(valid) or c.get("benchmark") != result["score"]
                    row["disagree"] += disagrees
                    row["before"] += c["calls"] * c["state"] != float(valid)
                    if trajectory.kind == "gold":
                        gold_rows.append((pack.id, task.id, result["score"]))
                    if disagrees and len(examples) < 10:
                        examples.append(
                            f"  {task.id} {trajectory.kind} ({trajectory.note}): BFCL {error or 'pass'}"
                        )
                named = schema_refused(task, rng)
                if named is not None:
                    result = player.verdict(pack, task, named)
                    as_ran = Trajectory(
                        "as_ran",
                        [
                            [Call(UNKNOWN_TOOL, {}) if c is named.changed else c for c in t]
                            for t in named.turns
                        ],
                    )
                    raw, _ = bfcl_verdict(entry, category, named)
                    ran, _ = bfcl_verdict(entry, category, as_ran)
                    row = count["schema_refused (named)"]
                    row["n"] += 1
                    row["bfcl_pass"] += raw
                    row["disagree"] += result["score"] != float(ran)  # against what ran: must be 0
                    row["differs_from_unrefused"] += raw != ran
                    row["before"] += result["components"]["calls"] * result["components"]["state"] != float(
                        raw
                    )
            report(category, len(tasks), count, time.perf_counter() - started)
            for line in examples:
                print(line)
            for row in count.values():
                totals.update(row)
    print(
        f"\nall: {totals['n']} trajectories, {totals['disagree']} disagreements "
        f"(before: {totals['before']}); schema_refused: BFCL would have judged "
        f"{totals['differs_from_unrefused']} differently had the call run"
    )
    print("\nBFCL leaderboard line for the gold, through the server:")
    print(leaderboard(gold_rows).table())
    assert all(r == 1.0 for *_, r in gold_rows), "a gold trajectory did not pass"


def report(category: str, tasks: int, count: dict[str, Counter[str]], seconds: float) -> None:
    print(f"\n{category}: {tasks} tasks, {sum(r['n'] for r in count.values())} trajectories, {seconds:.0f} s")
    print(f"  {'kind':<30} {'n':>5} {'BFCL pass':>9} {'disagree':>8} {'before':>7}")
    for kind, row in count.items():
        extra = (
            f"  (BFCL on the unrefused call: {row['differs_from_unrefused']} differ)"
            if "named" in kind
            else ""
        )
        print(
            f"  {kind:<30} {row['n']:>5} {row['bfcl_pass']:>9} {row['disagree']:>8} {row['before']:>7}{extra}"
        )
    total = Counter()
    for row in count.values():
        total.update(row)
    print(
        f"  {'total':<30} {total['n']:>5} {total['bfcl_pass']:>9} {total['disagree']:>8} {total['before']:>7}"
    )


if __name__ == "__main__":
    main()
