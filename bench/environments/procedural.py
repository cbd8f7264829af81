"""Procedural packs: what generating a pack and running a task's session cost.

Per world: milliseconds to generate one task (``pack(world, 0, 200)``, and with both
generalisation knobs at 0.5: functional and parameter-type), and microseconds per task session (a fresh world plus the gold calls) two ways, side by side in one run:
(a) the pack's copy-on-write ``World`` (a session copies the records it touches) and
(b) a session that deep-copies the whole initial state first. The ratio b/a is what
copy-on-write saves per trajectory; results in bench/README.md.

    .venv/bin/python bench/environments/procedural.py [--tasks 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

from tools.envs.pack import Pack, call_depths
from tools.envs.procedural import WORLDS, pack
from tools.envs.world import World


def _session(p: Pack, world: World, task_index: int) -> None:
    task = p.tasks[task_index]
    depths = call_depths(task.gold.calls)
    for call in sorted(task.gold.calls, key=lambda c: depths[c.id]):
        p.call(world, call.name, call.arguments)


def _per_task(p: Pack, repeats: int, whole_copy: bool) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for index, task in enumerate(p.tasks):
            world = World(copy.deepcopy(p.base_state(task))) if whole_copy else p.new_world(task)
            _session(p, world, index)
        best = min(best, (time.perf_counter() - start) / len(p.tasks))
    return best * 1e6


GENERALISED = {"functional_generalisation": 0.5, "parameter_type_generalisation": 0.5}


def _generate(world: str, tasks: int, repeats: int, **options: float) -> tuple[float, Pack]:
    """Best of ``repeats``: milliseconds per task to build ``pack(world, 0, tasks, **options)``."""
    best, built = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        built = pack(world, 0, tasks, **options)
        best = min(best, (time.perf_counter() - start) * 1e3 / tasks)
    assert built is not None
    return best, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        "| world | records | state KiB | generate ms/task | generalised ms/task "
        "| session µs (a) CoW | (b) copy state | b/a |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in WORLDS:
        generate, p = _generate(name, args.tasks, args.repeats)
        scaled, _ = _generate(name, args.tasks, args.repeats, **GENERALISED)
        records = sum(len(rows) for rows in p.initial_state.values())
        size = len(json.dumps(p.initial_state)) / 1024
        cow = _per_task(p, args.repeats, whole_copy=False)
        full = _per_task(p, args.repeats, whole_copy=True)
        print(
            f"| {name} | {records} | {size:.0f} | {generate:.2f} | {scaled:.2f} | {cow:.0f} | {full:.0f} "
            f"| {full / cow:.1f}× |"
        )


if __name__ == "__main__":
    main()
