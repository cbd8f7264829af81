"""``trainer-client``: roll out a model against a tool server, and inspect the results.

Subcommands live in ``SUBCOMMANDS`` (name -> ``Subcommand``). Each one adds its own
arguments and runs on its own; heavy imports (torch, transformers, pandas) happen
inside ``run`` so that ``--help`` stays instant. Other modules add subcommands with
``register_subcommand`` (``train``, ``verl-config``) and are listed in
``PLUGIN_MODULES``, which ``main`` imports before parsing.

    trainer-client rollout --server http://127.0.0.1:8000 --data arithmetic/test.parquet \\
        --format hermes --verifier math_equal --limit 8 --n 2 --out runs/arith.jsonl
    trainer-client show runs/arith.jsonl --index 3

``rollout --script turns.jsonl`` replays scripted assistant turns instead of a model, so a
toolset and its verifier can be tested end to end without one (see ``load_script``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trainer_client.dataset import DatasetError, TaskRow, load_tasks
from trainer_client.shared import URL_ENV
from trainer_client.summary import format_summary, summarize

# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Subcommand:
    """One ``trainer-client`` subcommand: its help, its arguments and what it runs."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


SUBCOMMANDS: dict[str, Subcommand] = {}

# Modules that register more subcommands when imported (``show``, ``summary``, ``train``, ``verl-config``): each
# calls ``register_subcommand(Subcommand(...))`` at module level and keeps its heavy
# imports inside ``run``, so that ``trainer-client --help`` stays fast.
PLUGIN_MODULES: tuple[str, ...] = (
    "trainer_client.inspect_cli",
    "trainer_client.train_cli",
    "trainer_client.verl_config",
)


def register_subcommand(command: Subcommand) -> Subcommand:
    """Add (or replace) a subcommand; returns it, so it can be used at module level."""
    SUBCOMMANDS[command.name] = command
    return command


def _load_plugins() -> None:
    for module in PLUGIN_MODULES:
        importlib.import_module(module)


class CliError(Exception):
    """A user error: printed as ``error: ...`` with exit status 2."""


# ----------------------------------------------------------------------------- records


def segments(
    ids: Sequence[int], mask: Sequence[int], decode: Callable[[list[int]], str]
) -> list[dict[str, Any]]:
    """Runs of model tokens (mask 1) and observation tokens (mask 0), decoded."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append({"model": bool(mask[start]), "text": decode(list(ids[start:i]))})
            start = i
    return out


def trajectory_record(
    trajectory: Any, row: TaskRow, sample: int, decode: Callable[[list[int]], str]
) -> dict[str, Any]:
    """A ``rollout.Trajectory`` as one JSON-able dict (one line of the output JSONL).

    Images are in ``messages`` (docs/images.md, "Images in trajectories"); in ``segments``
    a run of one image's pad tokens is written once with its count."""
    if getattr(trajectory, "images", None):
        decode = _collapsing(decode)
    return {
        "id": trajectory.session_id,
        "index": row.index,
        "sample": sample,
        "data_source": row.data_source,
        "ground_truth": row.ground_truth,
        "reward": trajectory.reward_score,
        "reward_components": trajectory.reward_components,
        "reward_details": trajectory.reward_details,
        "final_answer": trajectory.final_answer,
        "stop_reason": str(trajectory.stop_reason),
        "num_turns": trajectory.num_turns,
        "error": trajectory.error,
        "metrics": trajectory.metrics,
        "messages": trajectory.messages,
        "calls": trajectory.calls,
        "num_prompt_messages": len(row.messages),
        "segments": segments(trajectory.response_ids, trajectory.response_mask, decode),
        "prompt_ids": trajectory.prompt_ids,
        "response_ids": trajectory.response_ids,
        "response_mask": trajectory.response_mask,
        "response_logprobs": trajectory.response_logprobs,
    }


_TOKEN_RUN = re.compile(r"(<\|?[A-Za-z_]+\|?>)\1+")


def _collapsing(decode: Callable[[list[int]], str]) -> Callable[[list[int]], str]:
    """``decode`` with runs of one special token (an image's pads) as ``<|image_pad|>×N``."""

    def collapsed(ids: list[int]) -> str:
        return _TOKEN_RUN.sub(lambda m: f"{m[1]}×{len(m[0]) // len(m[1])}", decode(ids))

    return collapsed


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(Path(path).expanduser(), "rb") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise CliError(f"{path}:{number} is not valid JSON: {exc}") from None


ToolsFor = Callable[[TaskRow], list[dict[str, Any]] | None]
SessionFor = Callable[[TaskRow, int], str]


async def rollout_rows(
    core: Any,
    rows: Sequence[TaskRow],
    n: int,
    *,
    verifier: str | None,
    concurrency: int,
    on_record: Callable[[dict[str, Any]], None],
    tools_for: ToolsFor | None = None,
    session_for: SessionFor | None = None,
) -> list[dict[str, Any]]:
    """Run ``n`` samples of every row concurrently (at most ``concurrency`` at once).

    ``tools_for`` gives a row's tool schemas for the chat template (``tool_chooser``);
    ``session_for`` its trajectory id (a scripted backend keys its turns by it).
    """
    gate = asyncio.Semaphore(max(1, concurrency))
    decode = core.codec.decode

    async def one(row: TaskRow, sample: int) -> dict[str, Any]:
        task = row.task()  # with the row's later user turns and simulated user, as the trainers read it
        task.tools = tools_for(row) if tools_for else None
        task.verifier = verifier
        session_id = session_for(row, sample) if session_for else None
        async with gate:
            trajectory = await core.run(task, session_id=session_id)
        record = trajectory_record(trajectory, row, sample, decode)
        on_record(record)
        return record

    return list(await asyncio.gather(*(one(row, s) for row in rows for s in range(n))))


# ----------------------------------------------------------------------------- rollout


def _json_arg(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    from trainer_client.parsers import parser_names
    from trainer_client.templates import TOOL_SCHEMA_MODES

    io = parser.add_argument_group("server and data")
    io.add_argument(
        "--server",
        default=os.environ.get(URL_ENV),
        help=f"tool server base URL, e.g. http://127.0.0.1:8000 (default ${URL_ENV}); "
        "several comma-separated URLs are replicas, and dns://NAME:PORT finds them in DNS "
        "(every address of NAME, e.g. a headless Kubernetes Service, looked up again every 5 s)",
    )
    io.add_argument("--token", default=None, help="bearer token (default $TOOLFACTORY_TOKEN)")
    io.add_argument(
        "--data", required=True, help="veRL-format parquet with the tasks (python -m tools.data build)"
    )
    io.add_argument("--limit", type=_positive, default=None, metavar="K", help="use the first K prompts only")
    io.add_argument("--offset", type=int, default=0, help="skip this many prompts first (default 0)")
    io.add_argument("--out", default=None, help="trajectories JSONL (default runs/rollout-<time>.jsonl)")
    io.add_argument(
        "--toolset",
        default=None,
        help="server toolset whose tool schemas the prompt may show (default: the server's default)",
    )

    model = parser.add_argument_group("model and format")
    model.add_argument(
        "--model",
        default="smollm2",
        help="'smollm2' (packaged SmolLM2-135M-Instruct) or a local HF dir; with --script, only its "
        "tokenizer and chat template are used",
    )
    model.add_argument(
        "--script",
        default=None,
        metavar="JSONL",
        help="replay scripted assistant turns instead of generating (no model needed): one JSON list of "
        'turn texts per dataset row, line N for row N, or {"index": N, "turns": [...]} lines; '
        '{"turns": [...]} without an index is the default for every other row',
    )
    model.add_argument(
        "--tool-schemas",
        choices=TOOL_SCHEMA_MODES,
        default="auto",
        help="tool schemas shown through the chat template's tools= support: 'auto' (default) the "
        "server's when the template renders tools and the prompt does not already name them, 'server' "
        "always, 'none' never; a dataset's extra_info.tools are used unless 'none'",
    )
    model.add_argument(
        "--format",
        default="hermes",
        choices=parser_names(),
        help="tool-call format the model writes (default hermes)",
    )
    model.add_argument(
        "--tool-result-template",
        default=None,
        help="how results are shown: 'chat' (tool messages via the chat template) or 'search_r1' "
        "(<information> text); default: search_r1 for --format search_r1, else chat",
    )
    model.add_argument("--n", type=_positive, default=1, help="samples per prompt (default 1)")
    model.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1.0)"
    )
    model.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0)")
    model.add_argument(
        "--max-tokens", type=_positive, default=128, help="new tokens per model turn (default 128)"
    )
    model.add_argument(
        "--max-turns", type=_positive, default=4, help="model turns per trajectory (default 4)"
    )
    model.add_argument(
        "--response-length",
        type=_positive,
        default=1024,
        help="response tokens per trajectory (default 1024)",
    )
    model.add_argument(
        "--max-obs-tokens", type=_positive, default=512, help="tokens one observation may add (default 512)"
    )
    model.add_argument("--seed", type=int, default=0, help="torch seed for sampling (default 0)")
    model.add_argument(
        "--user-tool",
        default="llm",
        help="server tool playing the simulated user of rows with a user scenario (extra_info.user_sim; "
        "python -m tools.data build --env-user simulated) (default llm)",
    )
    model.add_argument(
        "--max-user-turns",
        type=_positive,
        default=10,
        help="messages the simulated user may send per trajectory (default 10)",
    )

    scoring = parser.add_argument_group("scoring and execution")
    scoring.add_argument("--verifier", default=None, help="server verifier, e.g. exact_match, f1, math_equal")
    scoring.add_argument(
        "--verifier-args",
        type=_json_arg,
        default={},
        metavar="JSON",
        help="verifier options, e.g. '{\"weights\": ...}'",
    )
    scoring.add_argument(
        "--success-threshold", type=float, default=1.0, help="reward that counts as success (default 1.0)"
    )
    scoring.add_argument(
        "--concurrency", type=_positive, default=32, help="trajectories in flight at once (default 32)"
    )
    scoring.add_argument(
        "--batch-size", type=_positive, default=8, help="generation batch size on the CPU backend (default 8)"
    )
    scoring.add_argument("--no-progress", action="store_true", help="no progress bar")


def default_template(fmt: str, template: str | None) -> str | None:
    if template is not None:
        return None if template == "chat" else template
    return "search_r1" if fmt == "search_r1" else None


def _server_urls(value: str | None) -> list[str]:
    if not value:
        raise CliError(f"no tool server given: pass --server URL or set ${URL_ENV}")
    return [u.strip() for u in value.split(",") if u.strip()]


def run_rollout(args: argparse.Namespace) -> int:
    urls = _server_urls(args.server)
    rows = load_tasks(args.data, limit=args.limit, offset=args.offset)
    if not rows:
        raise CliError(f"{args.data} has no rows in the selected range")
    script = load_script(args.script, rows) if args.script else None
    out = Path(args.out or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}.jsonl").expanduser()
    summary = asyncio.run(_rollout(args, urls, rows, out, script))
    print(format_summary(summary, title=f"rollout summary ({out})"))
    return 0


def rollout_config(args: argparse.Namespace) -> Any:
    from trainer_client.rollout import RolloutConfig

    return RolloutConfig(
        format=args.format,
        max_turns=args.max_turns,
        max_obs_tokens=args.max_obs_tokens,
        response_length=args.response_length,
        sampling_params={"temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens},
        tool_result_template=default_template(args.format, args.tool_result_template),
        toolset=args.toolset,
        verifier=args.verifier,
        verifier_arguments=args.verifier_args,
        user_tool=args.user_tool,
        max_user_turns=args.max_user_turns,
    )


async def _rollout(
    args: argparse.Namespace,
    urls: list[str],
    rows: list[TaskRow],
    out: Path,
    script: dict[int, list[str]] | None,
) -> dict[str, Any]:
    from trainer_client.client import ToolClient
    from trainer_client.rollout import RolloutCore

    async with ToolClient(urls, token=args.token, toolset=args.toolset) as client:
        health = await client.check_health()
        if not any(health.values()):
            raise CliError(
                f"cannot reach the tool server at {', '.join(urls)} (start one with: tool-server serve)"
            )
        config = rollout_config(args)
        if script is not None:
            tokenizer, generator, renderer, session_for = scripted_backend(args, config, script)
        else:
            tokenizer, generator, renderer, session_for = hf_backend(args, config)
        core = RolloutCore(
            tokenizer,
            generator,
            client,
            config,
            verifier=client if args.verifier else None,
            renderer=renderer,
        )
        tools_for = await tool_chooser(client, core, args.tool_schemas, args.toolset)
        try:
            records, wall = await run_and_write(
                core,
                rows,
                args.n,
                out,
                verifier=args.verifier,
                concurrency=args.concurrency,
                progress=not args.no_progress,
                tools_for=tools_for,
                session_for=session_for,
            )
        finally:
            aclose = getattr(generator, "aclose", None)
            if aclose is not None:
                await aclose()
        summary = summarize(
            records, wall_s=wall, client_metrics=client.metrics(), success_threshold=args.success_threshold
        )
    out.with_suffix(".summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary


def hf_backend(args: argparse.Namespace, config: Any) -> tuple[Any, Any, Any, None]:
    """SmolLM2 or a local HF model on the CPU: (tokenizer, generator, renderer, None)."""
    import torch

    from trainer_client.backends.hf import HFGenerator
    from trainer_client.models import load_model
    from trainer_client.templates import make_renderer

    torch.manual_seed(args.seed)
    tokenizer, model = load_model(args.model)
    generator = HFGenerator(
        model, tokenizer, max_batch_size=args.batch_size, default_max_tokens=args.max_tokens
    )
    renderer = make_renderer(
        tokenizer, config.tool_result_template, chat_template_kwargs=config.chat_template_kwargs
    )
    return tokenizer, generator, renderer, None


async def tool_chooser(client: Any, core: Any, mode: str, toolset: str | None) -> ToolsFor:
    """The tool schemas each row shows the model (``templates.prompt_tools``); the
    server's descriptors are fetched once, from ``/v1/tools``."""
    from trainer_client.templates import openai_tool_schemas, prompt_tools

    server_tools = openai_tool_schemas(await client.list_tools(toolset)) if mode != "none" else None
    renders_tools = core.renderer.renders_tools

    def choose(row: TaskRow) -> list[dict[str, Any]] | None:
        dataset_tools = row.extra_info.get("tools")
        return prompt_tools(
            mode,
            messages=row.messages,
            dataset_tools=dataset_tools if isinstance(dataset_tools, list) else None,
            server_tools=server_tools,
            renders_tools=renders_tools,
            format=core.config.format,
        )

    return choose


# ----------------------------------------------------------------------------- scripted backend


def load_script(path: str | Path, rows: Sequence[TaskRow]) -> dict[int, list[str]]:
    """Scripted assistant turns per dataset row index, from a JSONL file.

    Each line is a JSON list of turn texts (line N is row N), or an object
    ``{"index": N, "turns": [...]}``; ``{"turns": [...]}`` without an index is the
    default for every row without its own turns. Every selected row must get turns.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise CliError(f"script {path} not found")
    by_index: dict[int, list[str]] = {}
    default: list[str] | None = None
    for line_number, entry in enumerate(read_records(path)):
        index, turns = _script_entry(entry, line_number, path)
        if index is None:
            default = turns
        else:
            by_index[index] = turns
    missing = [row.index for row in rows if row.index not in by_index and default is None]
    if missing:
        raise CliError(
            f'{path} has no turns for dataset row(s) {missing[:10]} and no default {{"turns": ...}}'
        )
    return {row.index: by_index.get(row.index, default or []) for row in rows}


def _script_entry(entry: Any, line_number: int, path: Path) -> tuple[int | None, list[str]]:
    where = f"{path} entry {line_number}"
    if isinstance(entry, list):
        index: Any = line_number
        turns = entry
    elif isinstance(entry, dict) and "turns" in entry:
        index, turns = entry.get("index"), entry["turns"]
    else:
        raise CliError(f'{where}: expected a list of turn texts or {{"index": N, "turns": [...]}}')
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise CliError(f"{where}: index must be an integer, got {index!r}")
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise CliError(f"{where}: turns must be a list of strings (the assistant's texts)")
    return index, turns


def scripted_backend(
    args: argparse.Namespace, config: Any, script: dict[int, list[str]]
) -> tuple[Any, Any, Any, SessionFor]:
    """A ``ScriptedGenerator`` replaying each row's turns: (tokenizer, generator, renderer,
    session_for). Every turn ends with the end-of-turn token, as a model's would, unless a
    stop string (``</tool_call>``, ``</answer>``) ends it first."""
    from protocol import new_session_id
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.models import load_tokenizer
    from trainer_client.templates import make_renderer

    tokenizer = load_tokenizer(args.model)
    renderer = make_renderer(
        tokenizer, config.tool_result_template, chat_template_kwargs=config.chat_template_kwargs
    )
    end = _end_of_turn_id(renderer, tokenizer)
    generator = ScriptedGenerator([], tokenizer=tokenizer, eos_token_ids=[end])
    turns = {
        index: [ScriptedTurn(renderer.codec.encode(text) + [end]) for text in texts]
        for index, texts in script.items()
    }

    def session_for(row: TaskRow, sample: int) -> str:
        session = new_session_id()
        generator.assign(session, turns[row.index])
        return session

    return tokenizer, generator, renderer, session_for


def _end_of_turn_id(renderer: Any, tokenizer: Any) -> int:
    """The token a chat model ends its turn with (ChatML: ``<|im_end|>``)."""
    if renderer.turn_end_ids and renderer.turn_end_ids[0] in renderer.eos_token_ids:
        return int(renderer.turn_end_ids[0])
    if renderer.eos_token_ids:
        return min(renderer.eos_token_ids)
    raise CliError("the tokenizer has no end-of-turn token; a scripted rollout needs one")


async def run_and_write(
    core: Any,
    rows: Sequence[TaskRow],
    n: int,
    out: Path,
    *,
    verifier: str | None,
    concurrency: int,
    progress: bool = True,
    description: str = "trajectories",
    tools_for: ToolsFor | None = None,
    session_for: SessionFor | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Roll out and append each record to ``out`` as it finishes; returns (records, wall s)."""
    from tqdm import tqdm

    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(rows) * n, desc=description, unit="traj", disable=not progress, file=sys.stderr)
    rewards: list[float] = []
    with open(out, "wb") as handle:

        def on_record(record: dict[str, Any]) -> None:
            handle.write(orjson.dumps(record) + b"\n")
            handle.flush()
            if record.get("reward") is not None:
                rewards.append(record["reward"])
                bar.set_postfix(reward=f"{sum(rewards) / len(rewards):.3f}", refresh=False)
            bar.update(1)

        started = time.perf_counter()
        try:
            records = await rollout_rows(
                core,
                rows,
                n,
                verifier=verifier,
                concurrency=concurrency,
                on_record=on_record,
                tools_for=tools_for,
                session_for=session_for,
            )
        finally:
            bar.close()
    return records, time.perf_counter() - started


register_subcommand(
    Subcommand(
        "rollout",
        "roll out a model on a dataset against a tool server; writes trajectories and a summary",
        add_rollout_arguments,
        run_rollout,
        description="Generate multi-turn trajectories with a local model (CPU, HF transformers) or replay "
        "scripted turns (--script), run the tool calls on the tool server, score them with a server "
        "verifier, and write one JSON line per trajectory (ids, loss mask, messages, reward, metrics) plus "
        "<out>.summary.json.",
    )
)
# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(
        prog="trainer-client",
        description="Roll out and train LLMs on multi-turn tool use against a toolfactory tool server.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS.values():
        sub = commands.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
        )
        command.configure(sub)
        sub.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (CliError, DatasetError) as exc:
        print(f"trainer-client: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainer-client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
