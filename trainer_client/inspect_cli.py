"""``trainer-client show`` and ``trainer-client summary``: read a trajectories JSONL back.

``show`` prints one trajectory with model and observation tokens told apart (colour, or
``[obs]`` markers); ``summary`` recomputes the summary table of a whole file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import orjson

from trainer_client.cli import CliError, Subcommand, read_records, register_subcommand
from trainer_client.summary import format_summary, summarize

__all__ = ["render_record"]

_GREEN, _CYAN, _DIM, _BOLD, _RESET = "\033[32m", "\033[36m", "\033[2m", "\033[1m", "\033[0m"


def _use_color(choice: str, stream: TextIO) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


def render_record(record: dict[str, Any], *, color: bool, prompt: bool = False) -> str:
    """One trajectory as text: model tokens and observation tokens visibly apart.

    With colour, model text is green and observations cyan; without, observations are
    wrapped in ``[obs]...[/obs]``.
    """
    lines = [
        f"trajectory {record.get('id')}  (prompt {record.get('index')}, sample {record.get('sample')}, "
        f"{record.get('data_source')})",
        f"reward {record.get('reward')}  stop {record.get('stop_reason')}  turns {record.get('num_turns')}  "
        f"final answer {record.get('final_answer')!r}  ground truth {orjson.dumps(record.get('ground_truth')).decode()}",
    ]
    mask = record.get("response_mask") or []
    lines.append(f"tokens: {sum(mask)} model, {len(mask) - sum(mask)} observation")
    if record.get("error"):
        lines.append(f"error: {record['error']}")
    if prompt:
        lines.append("--- prompt messages")
        messages = record.get("messages") or []
        for message in messages[: record.get("num_prompt_messages", len(messages))]:
            lines.append(f"[{message.get('role')}] {message.get('content')}")
    lines.append("--- response" + ("" if color else "  (observation tokens inside [obs]...[/obs])"))
    parts = []
    for segment in record.get("segments") or []:
        text = segment["text"]
        if segment["model"]:
            parts.append(f"{_GREEN}{text}{_RESET}" if color else text)
        else:
            parts.append(f"{_CYAN}{_DIM}{text}{_RESET}" if color else f"[obs]{text}[/obs]")
    lines.append("".join(parts))
    if color:
        lines.append(
            f"{_BOLD}legend:{_RESET} {_GREEN}model tokens{_RESET}  {_CYAN}{_DIM}observation tokens{_RESET}"
        )
    return "\n".join(lines)


def run_show(args: argparse.Namespace) -> int:
    path = Path(args.file).expanduser()
    if not path.is_file():
        raise CliError(f"{path} not found")
    chosen = None
    count = 0
    for number, record in enumerate(read_records(path)):
        count += 1
        if (args.id is not None and record.get("id") == args.id) or (
            args.id is None and number == args.index
        ):
            chosen = record
            break
    if chosen is None:
        wanted = f"id {args.id!r}" if args.id is not None else f"index {args.index}"
        raise CliError(f"{path} has no trajectory with {wanted} ({count} trajectories read)")
    print(render_record(chosen, color=_use_color(args.color, sys.stdout), prompt=args.prompt))
    return 0


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trajectories JSONL written by 'trainer-client rollout'")
    parser.add_argument(
        "--index", type=int, default=0, help="which trajectory (0-based line number; default 0)"
    )
    parser.add_argument("--id", default=None, help="pick the trajectory by its id instead")
    parser.add_argument("--prompt", action="store_true", help="also print the prompt messages")
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour model vs observation tokens (auto: when stdout is a terminal; else [obs] markers)",
    )


def add_summary_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trajectories JSONL written by 'trainer-client rollout'")
    parser.add_argument("--success-threshold", type=float, default=1.0, help="reward that counts as success")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run_summary(args: argparse.Namespace) -> int:
    path = Path(args.file).expanduser()
    if not path.is_file():
        raise CliError(f"{path} not found")
    summary = summarize(list(read_records(path)), success_threshold=args.success_threshold)
    if args.json:
        print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    else:
        print(format_summary(summary, title=f"summary of {path}"))
    return 0


register_subcommand(
    Subcommand(
        "show",
        "print one trajectory with model and observation tokens told apart",
        add_show_arguments,
        run_show,
    )
)
register_subcommand(
    Subcommand(
        "summary",
        "recompute the summary table of a trajectories JSONL",
        add_summary_arguments,
        run_summary,
    )
)
