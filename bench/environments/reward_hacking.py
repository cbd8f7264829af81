"""Reward hacking, before and after: each cheating family's best score under the default weights.

Builds the trajectories of ``tests/support/reward_hacks.py`` (every cheating family and the honest
ladder) over the packs of ``tests/verifiers/test_reward_hacking.py`` (the four procedural worlds at
levels 1-4, their typed and functional variants, the image environment) and scores each with the
``tool_use`` reward in train mode with the default weights, once with this tree's ``tools`` and
``protocol`` and once with ``--base REF``'s (``bench/git_ref.py``), each in its own process.

Per family it reports the highest score over all tasks and the highest among trajectories that
fail the task (eval mode's verdict below 1.0, as each side's own eval mode judges it). Not a speed
benchmark: a table for docs/environments.md ("Reward hacking").

Run: ``.venv/bin/python bench/environments/reward_hacking.py [--base REF] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))  # appended: a --base side puts its ref's copy first


def measure() -> dict[str, dict[str, float]]:
    """Per family: max score, max score among failed tasks, trajectories scored (this process's code)."""
    from tests.support.reward_hacks import cheats, ladder, play_in_process
    from tests.verifiers.test_reward_hacking import PACKS
    from tools.verifiers.tool_use.reward import score

    out: dict[str, dict[str, float]] = {}
    for p in PACKS.values():
        for task in p.tasks:
            for trajectory in [*cheats(task), *ladder(task)]:
                family = "honest_partial" if trajectory.family.startswith("honest_") else trajectory.family
                if trajectory.family == "honest_correct":
                    family = "honest_correct"
                world, request = play_in_process(p, task, trajectory)
                train = score(p, task, world, request, mode="train").score
                world, request = play_in_process(p, task, trajectory)
                failed = score(p, task, world, request, mode="eval").score < 1.0
                entry = out.setdefault(family, {"max": 0.0, "max_failed": 0.0, "n": 0})
                entry["max"] = max(entry["max"], train)
                if failed:
                    entry["max_failed"] = max(entry["max_failed"], train)
                entry["n"] += 1
    return out


def _side(path: str | None) -> dict[str, dict[str, float]]:
    code = "import json, sys; from bench.environments.reward_hacking import measure; print(json.dumps(measure()))"
    env_path = [str(REPO)] if path is None else [path, str(REPO)]
    run = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = {env_path!r}; {code}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise SystemExit(f"scoring failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="354413f", help="git ref of the reward before (default: 354413f)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    from bench.git_ref import export_ref

    print(f"scoring with {args.base}'s reward ...", file=sys.stderr, flush=True)
    before = _side(export_ref(args.base, "tools", "protocol"))
    print("scoring with this tree's reward ...", file=sys.stderr, flush=True)
    after = _side(None)
    print(
        f"| family | max before ({args.base}) | max failing before | max now | max failing now | trajectories |"
    )
    print("|---|---|---|---|---|---|")
    for family in sorted(after, key=lambda f: (f.startswith("honest"), f)):
        b, a = before.get(family, {}), after[family]
        print(
            f"| {family} | {b.get('max', float('nan')):.3f} | {b.get('max_failed', float('nan')):.3f} "
            f"| {a['max']:.3f} | {a['max_failed']:.3f} | {a['n']} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"base": args.base, "before": before, "after": after}, indent=1)
        )


if __name__ == "__main__":
    main()
