"""Reward parity with τ²-bench on ≥100 tasks per domain: our served eval-mode reward vs τ²'s own.

A real server (``tool-server serve``) serves the four τ² packs (telecom in τ²'s solo mode) and
telecom in τ²'s dual control (``telecom-dual``: a simulated customer makes the phone's calls).
Each task's gold is perturbed into non-gold trajectories of many kinds
(``tests/envs/tau2/parity.py``: a write dropped, repeated or moved first, a read dropped or
added, calls swapped or reversed, an argument changed in value or case, an integer sent as a
float and back, a failing call, ten of them, no calls, the run cut off or ended by the
customer; the facts told upper-cased, split, inside a longer number, with commas, in other
words, only inside a tool call or a thought, or not at all; telecom runs without ``done``,
with a text turn, with a write after ``done``; telecom-dual: the customer's phone actions dropped,
repeated, moved first, swapped, with other arguments, failing, ten failing, done by the agent
instead or by both, an agent's write done by the customer, the run ended by the agent).
Each plays in its own session through
``/v1/calls`` and is scored by ``/v1/verify`` (``tool_use``, eval mode) and by τ²'s own
``evaluate_simulation`` on the trajectory as τ²'s orchestrator records it (τ²'s environments
loaded from the package, its full-DB hashes).

Printed per domain and per kind: trajectories, how many τ² passes, disagreements of our reward
with τ²'s (target 0), and for comparison the disagreements of the reward before τ²'s verdict
was its eval reward (the product of the ``tool_use`` components of the task's reward basis,
still returned). Then the named difference: calls our server refused by schema (τ² checks no
schema and runs them; so does the verdict's replay) and how often τ²'s verdict would differ had
they never been made; and how often τ²'s own evaluator raised (scored 0, as its ``run_tasks``
scores a failed sample). Figures in
bench/README.md and docs/environments.md.

    .venv/bin/python bench/environments/reward_parity_tau2.py [--tasks 100] [--per-task 0]
        [--domains retail airline mock telecom telecom-dual]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.envs.tau2.parity import Outcome, outcome, perturbations  # noqa: E402
from tests.support.server import running_server, server_config  # noqa: E402
from tools.envs.tau2 import packs as tau2  # noqa: E402
from tools.envs.tau2.domain import DOMAINS  # noqa: E402
from tools.verifiers.tool_use.reward import BASIS_ALIASES  # noqa: E402

# τ²'s domains share tool names; "telecom-dual" is telecom in τ²'s dual control (pack mode "dual")
PREFIXES = {"mock": "", "retail": "r_", "airline": "a_", "telecom": "t_", "telecom-dual": "d_"}
LABELS = (*DOMAINS, "telecom-dual")


def arguments(label: str) -> dict:
    """The τ² pack's arguments for a label: its domain, and the mode of telecom-dual."""
    domain, _, mode = label.partition("-")
    return {"domain": domain, **({"mode": mode} if mode else {})}


def spread(items: list, count: int) -> list:
    """``count`` items evenly spread over ``items`` (all of them when there are fewer)."""
    if len(items) <= count:
        return items
    return [items[i * len(items) // count] for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks", type=int, default=100, help="tasks per domain, spread over it (all if fewer)"
    )
    parser.add_argument("--domains", nargs="*", default=list(LABELS), choices=LABELS)
    parser.add_argument(
        "--per-task",
        type=int,
        default=0,
        help="non-gold kinds per task, taken in turn so that every kind is covered (0: all of them); "
        "τ²'s side costs two full-DB hashes and three DB loads per trajectory (~1-3 s on retail, airline)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write each outcome as a JSON line here")
    args = parser.parse_args()
    packs = {label: tau2.pack(**arguments(label)) for label in args.domains}
    environments = [
        {"source": "tools.envs.tau2:pack", "prefix": PREFIXES[label], "arguments": arguments(label)}
        for label in args.domains
    ]
    started = time.perf_counter()
    rows: dict[str, Counter] = defaultdict(Counter)
    kinds: dict[str, Counter] = defaultdict(Counter)
    disagreements: list[tuple] = []
    with running_server(server_config(environments=environments), startup_timeout_s=900) as server:
        for label, pack in packs.items():
            domain = pack.info.domain
            tasks = spread(pack.tasks, args.tasks)
            for number, task in enumerate(tasks, 1):
                basis = [BASIS_ALIASES.get(b.lower(), b.lower()) for b in task.reward_basis]
                for trajectory in _chosen(list(perturbations(domain, task)), args.per_task, number):
                    o = outcome(server.url, pack, domain, task, trajectory, PREFIXES[label])
                    if args.out is not None:
                        with open(args.out, "a") as handle:
                            handle.write(json.dumps({**asdict(o), "agree": o.agree}) + "\n")
                    before = _before(o, basis)
                    for counter in (rows[label], kinds[trajectory.kind]):
                        counter["trajectories"] += 1
                        counter["tau2 passes"] += o.tau2 == 1.0
                        counter["disagree"] += not o.agree
                        counter["before"] += before != o.tau2
                        counter["refused"] += o.refused > 0
                        counter["refused, decided it"] += o.tau2_without_refused not in (None, o.tau2)
                        counter["τ² raised"] += o.tau2_crashed
                    if not o.agree:
                        disagreements.append(
                            (label, task.id, trajectory.kind, o.tau2, o.ours, o.reason[:160])
                        )
                rows[label]["tasks"] += 1
                print(f"\r{label}: {number}/{len(tasks)} tasks", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
    wall = time.perf_counter() - started
    columns = [
        "tasks",
        "trajectories",
        "tau2 passes",
        "disagree",
        "before",
        "refused",
        "refused, decided it",
        "τ² raised",
    ]
    print(
        f"τ² reward parity: {sum(r['trajectories'] for r in rows.values())} trajectories in {wall / 60:.1f} min\n"
    )
    _table("domain", rows, columns)
    print()
    _table("kind", kinds, columns[1:])
    for row in disagreements[:40]:
        print("DISAGREE", *row)


def _chosen(trajectories: list, per_task: int, turn: int) -> list:
    """The gold, and ``per_task`` of the other kinds starting at a place that moves with ``turn``."""
    gold, others = trajectories[:1], trajectories[1:]
    if not per_task or per_task >= len(others):
        return trajectories
    start = (turn * per_task) % len(others)
    return gold + [others[(start + i) % len(others)] for i in range(per_task)]


def _before(o: Outcome, basis: list[str]) -> float:
    """The eval reward before τ²'s verdict replaced it: the product of the basis components."""
    return math.prod(o.components[name] for name in basis)


def _table(first: str, rows: dict[str, Counter], columns: list[str]) -> None:
    widths = [max(len(first), *(len(k) for k in rows))] + [max(len(c), 6) for c in columns]
    print("  ".join(h.ljust(w) for h, w in zip([first, *columns], widths, strict=True)))
    for key, counter in rows.items():
        cells = [key, *(str(counter[c]) for c in columns)]
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))


if __name__ == "__main__":
    main()
