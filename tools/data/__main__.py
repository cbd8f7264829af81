"""``python -m tools.data build``: write the task datasets as veRL-format parquet files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tools.data import BUILDERS, arithmetic, search_qa, write_parquet

DEFAULT_OUT = "~/data/toolfactory"
ENV_PREFIX = "env:"  # --tasks env:<pack directory or module:callable>


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.data",
        description="Build the toolfactory task datasets (veRL-format parquet, train/test splits).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build",
        help="write <out>/<task>/{train,test}.parquet",
        description="Write <out>/<task>/{train,test}.parquet for each task. Same seed, same rows.",
    )
    build.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    build.add_argument(
        "--seed", type=int, default=0, help="random seed for shuffling and generation (default 0)"
    )
    build.add_argument(
        "--tasks",
        default=",".join(BUILDERS),
        help=f"comma-separated tasks to build (default: all of {', '.join(BUILDERS)}); 'env:<pack>' builds "
        "an environment pack's tasks into <out>/env/<pack id>/, <pack> being a pack directory or a "
        "'module:callable' source (e.g. env:tools.envs.procedural:pack)",
    )
    build.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env: an argument of every 'module:callable' pack source (repeatable; YAML values: 3, true)",
    )
    build.add_argument(
        "--env-test-fraction",
        type=float,
        default=0.1,
        help="env: fraction of tasks in the test split, for tasks without a split of their own (default 0.1)",
    )
    build.add_argument(
        "--env-levels",
        default=None,
        help="env: only tasks of these complexity levels, comma-separated (1-4; default all)",
    )
    build.add_argument(
        "--env-prefix",
        default="",
        help="env: the tool-name prefix the server's environments entry uses (default none)",
    )
    build.add_argument(
        "--env-shots",
        type=int,
        default=0,
        metavar="K",
        help="env: K worked examples written out as text in each prompt, with the tools and the call "
        "format (tools.data.env_prompts; for models whose chat template shows no tools, e.g. SmolLM2); "
        "procedural packs only (default 0: the pack's policy and the task's own prompt)",
    )
    build.add_argument(
        "--env-user",
        choices=("solo", "simulated"),
        default="solo",
        help="env: who plays the user of tasks with a user scenario (τ²). 'solo' (default): the prompt "
        "hands the agent the scenario as a ticket. 'simulated': the prompt is the customer's short "
        "opening and extra_info.user_sim carries the scenario, for an LLM user simulator in the rollout "
        "(the server's llm tool; trainer-client --user-tool, --max-user-turns); rows go to "
        "<out>/env/<pack id>-simulated/",
    )
    build.add_argument(
        "--few-shot",
        type=int,
        default=3,
        metavar="K",
        help=f"arithmetic: worked examples in each prompt, 0-{len(arithmetic.FEW_SHOT_EXAMPLES)} (default 3)",
    )
    build.add_argument(
        "--tool-role",
        choices=("tool", "user"),
        default="tool",
        help="arithmetic: role of the tool results in the few-shot examples (default tool)",
    )
    build.add_argument("--arith-train", type=int, default=2000, help="arithmetic train size (default 2000)")
    build.add_argument("--arith-test", type=int, default=200, help="arithmetic test size (default 200)")
    build.add_argument(
        "--search-test-fraction",
        type=float,
        default=0.2,
        help="search_qa: fraction of questions in the test split (default 0.2)",
    )
    build.add_argument(
        "--search-few-shot",
        type=int,
        default=0,
        metavar="K",
        help=f"search_qa: worked examples (search, information, answer) in each prompt, "
        f"0-{len(search_qa.SEARCH_WORKED_EXAMPLES)} (default 0; the demo uses 2: a 135M model searches only after seeing it done)",
    )
    return parser


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in BUILDERS and not t.startswith(ENV_PREFIX)]
    if unknown:
        _log(f"error: unknown task(s) {unknown}; known: {list(BUILDERS)}")
        return 2
    out = Path(args.out).expanduser()
    for task in tasks:
        started = time.perf_counter()
        _log(f"[{task}] building (seed {args.seed}) ...")
        folder = out / task
        try:
            if task.startswith(ENV_PREFIX):
                folder, rows = _env_rows(task[len(ENV_PREFIX) :], args, out)
            elif task == "search_qa":
                rows = search_qa.build_rows(
                    seed=args.seed, test_fraction=args.search_test_fraction, few_shot=args.search_few_shot
                )
            else:
                rows = arithmetic.build_rows(
                    n_train=args.arith_train,
                    n_test=args.arith_test,
                    seed=args.seed,
                    few_shot=args.few_shot,
                    tool_role=args.tool_role,
                )
        except (FileNotFoundError, ValueError) as exc:
            _log(f"[{task}] error: {exc}")
            return 1
        for split, split_rows in rows.items():
            if not split_rows:
                _log(f"[{task}] {split}: no rows, no file")
                continue
            path = write_parquet(split_rows, folder / f"{split}.parquet")
            _log(f"[{task}] {split}: {len(split_rows)} rows -> {path}")
        _log(f"[{task}] done in {time.perf_counter() - started:.1f}s")
    return 0


def _env_rows(ref: str, args: argparse.Namespace, out: Path) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    """An environment pack's rows and their folder (<out>/env/<pack id>)."""
    from tools.data import environments
    from tools.envs.host import open_pack, parse_arguments

    arguments = parse_arguments(args.env_arg)
    is_source = ":" in ref and not Path(ref).exists()
    pack = open_pack(ref, arguments if is_source else None)
    levels = None
    if args.env_levels:
        try:
            levels = {int(level) for level in args.env_levels.split(",") if level.strip()}
        except ValueError:
            raise ValueError(
                f"--env-levels must be comma-separated integers, got {args.env_levels!r}"
            ) from None
    rows = environments.build_rows(
        pack,
        seed=args.seed,
        test_fraction=args.env_test_fraction,
        prefix=args.env_prefix,
        levels=levels,
        user=args.env_user,
    )
    if args.env_shots:
        from tools.data.env_prompts import few_shot_rows

        rows = few_shot_rows(pack, rows, args.env_shots, levels or (1, 2), args.seed)
    suffix = "-simulated" if args.env_user == "simulated" else ""
    return out / "env" / (pack.id + suffix), rows


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return build(args)
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
