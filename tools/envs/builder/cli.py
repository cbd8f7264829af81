"""Command line of the builder: ``tool-server env build`` and ``python -m tools.envs.builder``.

``configure(parser)`` adds the options to an argparse parser (a subcommand's or a
standalone one); ``run(args)`` builds and returns the exit status: 0 the pack was built,
1 the build stopped (the report says at which stage and why), 2 bad options.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pipeline (httpx, jsonschema, the sandbox) loads when a build runs, not for --help
    from tools.envs.builder.pipeline import BuildConfig

JSON_MODES = ("auto", "schema", "object", "off")  # llm.JSON_MODES (not imported: it loads httpx)

__all__ = ["configure", "main", "run"]


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--scenario", required=True, help="what the world is about (text, or @file to read it)"
    )
    parser.add_argument("--model", required=True, help="OpenAI-compatible endpoint, e.g. http://host:8000/v1")
    parser.add_argument(
        "--model-name",
        default=None,
        help="model name sent in each request (default: the first at <endpoint>/models)",
    )
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key"
    )
    parser.add_argument("--out", required=True, type=Path, help="build directory (stages, report, pack/)")
    parser.add_argument("--pack-id", default=None, help="id of the pack (default: built-<domain>-<hash>)")
    parser.add_argument("--levels", default="1,2,3,4", help="task levels to compose, e.g. 1,2")
    parser.add_argument("--tasks-per-level", type=int, default=3)
    parser.add_argument(
        "--attempts", type=int, default=3, help="answers asked per stage item before giving up"
    )
    parser.add_argument("--parallel", type=int, default=4, help="model requests at once (stages 3 and 4)")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.2)
    parser.add_argument(
        "--json-mode",
        choices=JSON_MODES,
        default="auto",
        help="how answers are asked for: schema (response_format json_schema with each stage's shape: "
        "structured decoding, even small models write valid JSON), object (json_object), off (no "
        "response_format); auto (default): schema, and object if the endpoint refuses schemas",
    )
    parser.add_argument(
        "--no-json-mode",
        dest="json_mode",
        action="store_const",
        const="off",
        help="the same as --json-mode off",
    )
    parser.add_argument(
        "--small-model",
        action="store_true",
        help="with --json-mode schema/auto, shape the answers for a very small model (fixed sizes, an id key, "
        "three records with given keys, one-line tools, short texts): less room, but valid worlds",
    )
    parser.add_argument(
        "--no-toolset-extension",
        action="store_true",
        help="no distractor variants of tasks without distractors",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _config(args: argparse.Namespace) -> BuildConfig:
    from tools.envs.builder.llm import ChatModel
    from tools.envs.builder.pipeline import BuildConfig

    scenario = args.scenario
    if scenario.startswith("@"):
        try:
            scenario = Path(scenario[1:]).expanduser().read_text()
        except OSError as exc:
            raise ValueError(f"--scenario {args.scenario}: {exc}") from None
    try:
        levels = [int(x) for x in str(args.levels).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--levels must be comma-separated numbers 1-4, got {args.levels!r}") from None
    model = ChatModel(
        args.model,
        args.model_name,
        api_key=os.environ.get(args.api_key_env) or None,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        json_mode=args.json_mode,
    )
    return BuildConfig(
        scenario, args.out, model, attempts=args.attempts, tasks_per_level=args.tasks_per_level,
        levels=levels, pack_id=args.pack_id, extend_toolset=not args.no_toolset_extension, parallel=args.parallel,
        small_model=args.small_model, progress=not args.no_progress,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except ValueError as exc:
        print(f"env build: {exc}", file=sys.stderr)
        return 2
    try:
        from tools.envs.builder.pipeline import build

        report = build(config)
    except ValueError as exc:
        print(f"env build: {exc}", file=sys.stderr)
        return 2
    finally:
        config.model.close()
    print(report.table())
    print(f"report: {config.out / 'report.json'}")
    return 0 if report.status == "built" else 1


def main(argv: list[str] | None = None) -> int:
    parser = configure(argparse.ArgumentParser(prog="python -m tools.envs.builder", description=__doc__))
    return run(parser.parse_args(argv))
