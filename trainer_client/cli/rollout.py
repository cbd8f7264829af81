"""``trainer-client rollout``: roll out a model on a dataset against a tool server.

Generates with a local model (``generators.hf_backend``), a vLLM server (``--engine vllm``,
``generators.vllm_backend``) or replays scripted turns (``--script``,
``generators.scripted_backend``), runs the calls on the tool server,
scores them with a server verifier, and writes one JSON line per trajectory
(``trainer_client.rollout.records``) plus ``<out>.summary.json``. One Ctrl-C stops it within
one layer's work of the model: the trajectories that finished are in the file, their summary
is written (``"interrupted": true``), the sessions are released, and it exits 130.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

import orjson

from trainer_client.cli.generators import (
    add_engine_arguments,
    engine_server,
    hf_backend,
    load_script,
    scripted_backend,
    vllm_backend,
)
from trainer_client.cli.preflight import check_model, check_verifier
from trainer_client.cli.subcommands import CliError, Subcommand, register_subcommand
from trainer_client.rollout.dataset import TaskRow, load_tasks
from trainer_client.rollout.runner import interrupt_at_once, run_and_write, tool_chooser
from trainer_client.rollout.summary import format_summary, summarize
from trainer_client.shared import URL_ENV

__all__ = ["add_rollout_arguments", "default_template", "rollout_config", "run_rollout"]


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


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:  # a negative offset would count from the end and repeat rows
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def _tool_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a server tool, got {text!r}")
    return text


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    from trainer_client.parsers.registry import parser_names
    from trainer_client.templates.render import TOOL_SCHEMA_MODES

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
    io.add_argument(
        "--offset", type=_non_negative, default=0, help="skip this many prompts first (default 0)"
    )
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
    add_engine_arguments(model)
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
        type=_tool_name,
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
    urls = [u.strip() for u in (value or "").split(",") if u.strip()]
    if not urls:
        raise CliError(f"no tool server given: pass --server URL or set ${URL_ENV}")
    return urls


def run_rollout(args: argparse.Namespace) -> int:
    urls = _server_urls(args.server)
    rows = load_tasks(args.data, limit=args.limit, offset=args.offset)
    if not rows:
        raise CliError(f"{args.data} has no rows in the selected range")
    script = load_script(args.script, rows) if args.script else None
    if script is not None and args.engine != "hf":
        raise CliError("--script replays its own turns: leave out --engine")
    check_model(args.model)  # typos fail here, in one line, before a model loads or a server starts
    check_verifier(args.verifier, urls, args.token)
    out = Path(args.out or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}.jsonl").expanduser()
    # Ctrl-C: asyncio.run cancels _rollout (the trajectories end and release their sessions,
    # generation stops before its next layer, the summary of what finished is written), then
    # raises KeyboardInterrupt, which ``trainer-client`` reports as "interrupted" (exit 130).
    with engine_server(args):  # --engine vllm without --engine-url: a local server, always stopped
        summary = asyncio.run(_rollout(args, urls, rows, out, script))
    print(format_summary(summary, title=f"rollout summary ({out})"))
    return 0


def rollout_config(args: argparse.Namespace) -> Any:
    from trainer_client.rollout.core import RolloutConfig

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
    from trainer_client.client.tool_client import ToolClient
    from trainer_client.gc_tuning import freeze_startup_heap
    from trainer_client.rollout.core import RolloutCore

    async with ToolClient(urls, token=args.token, toolset=args.toolset) as client:
        health = await client.check_health()
        if not any(health.values()):
            raise CliError(
                f"cannot reach the tool server at {', '.join(urls)} (start one with: tool-server serve)"
            )
        config = rollout_config(args)
        if script is not None:
            tokenizer, generator, renderer, session_for = scripted_backend(args, config, script)
        elif args.engine == "vllm":
            tokenizer, generator, renderer, session_for = await vllm_backend(args, config)
        else:
            with interrupt_at_once():  # loading blocks the event loop: Ctrl-C must still stop it
                tokenizer, generator, renderer, session_for = hf_backend(args, config)
        freeze_startup_heap()  # the model and clients live as long as the process: no GC walks them
        core = RolloutCore(
            tokenizer,
            generator,
            client,
            config,
            verifier=client if args.verifier else None,
            renderer=renderer,
        )
        tools_for = await tool_chooser(client, core, args.tool_schemas, args.toolset)
        finished: list[dict[str, Any]] = []
        started = time.perf_counter()
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
                finished=finished,
            )
        except asyncio.CancelledError:  # Ctrl-C: the trajectories were cancelled and released
            _write_interrupted(args, out, finished, len(rows) * args.n, started, client.metrics())
            raise
        finally:
            aclose = getattr(generator, "aclose", None)
            if aclose is not None:
                await aclose()  # stops a batch being generated before its next layer
        summary = summarize(
            records, wall_s=wall, client_metrics=client.metrics(), success_threshold=args.success_threshold
        )
    _summary_path(out).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary


def _summary_path(out: Path) -> Path:
    return out.with_suffix(".summary.json")


def _write_interrupted(
    args: argparse.Namespace,
    out: Path,
    finished: list[dict[str, Any]],
    planned: int,
    started: float,
    client_metrics: dict[str, Any],
) -> None:
    """The summary of what finished before Ctrl-C, marked interrupted (its records are in ``out``)."""
    summary = summarize(
        finished,
        wall_s=time.perf_counter() - started,
        client_metrics=client_metrics,
        success_threshold=args.success_threshold,
    )
    summary["interrupted"] = True
    summary["planned_trajectories"] = planned
    _summary_path(out).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    title = f"rollout summary ({out}): interrupted, {len(finished)} of {planned} trajectories finished"
    print(format_summary(summary, title=title), flush=True)


register_subcommand(
    Subcommand(
        "rollout",
        "roll out a model on a dataset against a tool server; writes trajectories and a summary",
        add_rollout_arguments,
        run_rollout,
        description="Generate multi-turn trajectories with a local model (CPU, HF transformers), a vLLM server "
        "(--engine vllm) or replay "
        "scripted turns (--script), run the tool calls on the tool server, score them with a server "
        "verifier, and write one JSON line per trajectory (ids, loss mask, messages, reward, metrics) plus "
        "<out>.summary.json.",
    )
)
