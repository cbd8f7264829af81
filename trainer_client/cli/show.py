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

from protocol.images import image_info
from trainer_client.cli.command import CliError, Subcommand, register_subcommand
from trainer_client.rollout.records import read_records
from trainer_client.rollout.summary import format_summary, summarize

__all__ = ["describe_content", "render_record"]

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
            lines.append(f"[{message.get('role')}] {describe_content(message.get('content'))}")
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
    lines += _tool_results(record)
    if record.get("reward_details"):
        lines.append(f"verifier's details: {orjson.dumps(record['reward_details']).decode()}")
    return "\n".join(lines)


def describe_content(content: Any, images: list[int] | None = None, *, short: bool = False) -> str:
    """A message's content as text: text blocks as they are (``short``: on one line, cut), each image as a marker.

    ``[image 1: image/png 640x480, 12 KB]`` (type and size read from the header only);
    ``images`` is a one-item counter, to number the images across a trajectory.
    """
    if not isinstance(content, list):
        return _shorten(str(content)) if short else str(content)
    counter = images if images is not None else [0]
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text = str(block.get("text", ""))
            parts.append(_shorten(text) if short else text)
        elif kind == "image":
            counter[0] += 1
            parts.append(_image_marker(block, counter[0]))
        else:
            parts.append(f"[{kind or 'unknown'} block]")
    return (" " if short else "\n").join(parts)


def _image_marker(block: dict[str, Any], number: int) -> str:
    mime, data = block.get("mimeType"), block.get("data")
    if not data:
        return f"[image {number}: {mime}, data not stored]"
    try:
        info = image_info(data, mime)
    except ValueError as exc:
        return f"[image {number}: {mime}, unreadable: {exc}]"
    return f"[image {number}: {info.mime_type} {info.width}x{info.height}, {_size(info.size)}]"


def _size(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB" if size >= 1024 * 1024 else f"{max(1, round(size / 1024))} KB"


def _tool_results(record: dict[str, Any]) -> list[str]:
    """One line per tool result: its call's server latency, cache hit and error kind, its images marked.

    Files written before the rollout recorded ``calls`` show the results without figures.
    """
    messages = record.get("messages") or []
    start = record.get("num_prompt_messages", 0)
    calls = {c.get("message"): c for c in record.get("calls") or [] if isinstance(c, dict)}
    lines, images = [], [0]
    for number, message in enumerate(messages[start:], start):
        if message.get("role") != "tool":
            continue
        call = calls.pop(number, None)
        head = f"[tool {message.get('name', '')}{_call_figures(call)}]"
        lines.append(f"{head} {describe_content(message.get('content'), images, short=True)}")
    for call in calls.values():  # cut by the response budget before its result was spliced
        lines.append(f"[tool {call.get('name', '')}{_call_figures(call)}] (result not shown to the model)")
    return ["--- tool results", *lines] if lines else []


def _call_figures(call: dict[str, Any] | None) -> str:
    if call is None:
        return ""
    figures = [f"{call.get('elapsed_ms', 0):.1f} ms"]
    if call.get("cached"):
        figures.append("cache hit")
    if call.get("error"):
        figures.append(f"error {call['error']}")
    return " · " + ", ".join(figures)


def _shorten(text: str, limit: int = 200) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
