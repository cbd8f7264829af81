"""``python -m tools.data build``: write the task datasets as veRL-format parquet files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tools.data import BUILDERS, arithmetic, search_qa, write_parquet

DEFAULT_OUT = "~/data/toolfactory"


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
        help=f"comma-separated tasks to build (default: all of {', '.join(BUILDERS)})",
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
    return parser


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in BUILDERS]
    if unknown:
        _log(f"error: unknown task(s) {unknown}; known: {list(BUILDERS)}")
        return 2
    out = Path(args.out).expanduser()
    for task in tasks:
        started = time.perf_counter()
        _log(f"[{task}] building (seed {args.seed}) ...")
        try:
            if task == "search_qa":
                rows = search_qa.build_rows(seed=args.seed, test_fraction=args.search_test_fraction)
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
            path = write_parquet(split_rows, out / task / f"{split}.parquet")
            _log(f"[{task}] {split}: {len(split_rows)} rows -> {path}")
        _log(f"[{task}] done in {time.perf_counter() - started:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return build(args)
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
