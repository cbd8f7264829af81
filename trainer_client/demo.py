"""``python -m trainer_client.demo``: the whole loop on one CPU machine, in a few minutes.

1. builds the task data (``python -m tools.data build``, as a subprocess);
2. starts ``tool-server serve`` with its default config on a free loopback port and
   waits for ``/readyz``;
3. rolls out SmolLM2-135M-Instruct on the built-in search QA (Search-R1 tags,
   ``search`` tool) and arithmetic (hermes ``<tool_call>``, ``calculator`` tool) tasks and
   on an environment (a procedural bank world: every trajectory gets its own world, bound
   to its task, and the ``tool_use`` reward reads the calls and the state it left) through
   the batched client, scoring every trajectory with the server's verifiers;
4. prints the summary table and where the trajectories are (``trainer-client show``);
5. always stops the server, also on Ctrl-C or an error.

The trainer side talks to the server only over HTTP: this module shells out to the
data builder and the server and imports neither ``tools`` nor ``tool_server``.
A 135M model scores low on these tasks; the point is the plumbing, end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from trainer_client.cli.command import CliError
from trainer_client.cli.generators import add_engine_arguments, engine_server, vllm_generator
from trainer_client.cli.preflight import check_model
from trainer_client.demo_engine import choose_engine, torch_threads, vllm_installed
from trainer_client.demo_report import report
from trainer_client.rollout.dataset import load_tasks
from trainer_client.rollout.runner import interrupt_at_once, run_and_write, tool_chooser
from trainer_client.rollout.token_progress import GenerationProgress
from trainer_client.templates.render import TOOL_SCHEMA_MODES


@dataclass(frozen=True)
class DemoTask:
    """One built-in task and how the model should talk to its tool."""

    name: str
    format: str
    tool_result_template: str | None
    verifier: str
    verifier_arguments: dict[str, Any]


TASKS = (
    DemoTask("search_qa", "search_r1", "search_r1", "exact_match", {}),
    DemoTask("arithmetic", "hermes", None, "math_equal", {}),
    # an environment: a procedural bank world served per trajectory (one copy-on-write world
    # per session, bound to the row's task), scored by the tool_use reward (all or nothing)
    DemoTask("bank", "hermes", None, "tool_use", {"mode": "eval"}),
)

# The environment the demo serves and builds its "bank" rows from (same arguments both times).
BANK_PACK = "demo-bank"
BANK_ARGUMENTS = {
    "world": "bank",
    "tasks": 40,
    "levels": [1, 2],
    "parameter_expansion": 0.0,
    "pack_id": BANK_PACK,
}
# Worked examples of a search in each search_qa prompt: without them SmolLM2-135M never searches.
SEARCH_SHOTS = 2


# ----------------------------------------------------------------------------- processes


def build_data(out: Path, log: TextIO) -> None:
    """Run the data builder as a subprocess (the trainer never imports ``tools``): the built-in
    tasks, then the bank environment's tasks with worked examples in their prompts."""
    environment = [
        "--tasks",
        "env:tools.envs.procedural:pack",
        "--env-shots",
        "2",
        "--env-test-fraction",
        "0.25",
    ]
    for key, value in BANK_ARGUMENTS.items():
        environment += ["--env-arg", f"{key}={json.dumps(value)}"]
    for extra in (["--search-few-shot", str(SEARCH_SHOTS)], environment):
        cmd = [sys.executable, "-m", "tools.data", "build", "--out", str(out), *extra]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        log.write(done.stdout)
        if done.returncode != 0:
            raise CliError(f"building the task data failed ({' '.join(cmd)}):\n{done.stdout}")


def server_config(out: Path) -> Path:
    """The built-in server config plus the bank environment."""
    path = out / "server.yaml"
    path.write_text(
        json.dumps(
            {
                "extends": "builtin",
                "environments": [{"source": "tools.envs.procedural:pack", "arguments": BANK_ARGUMENTS}],
            }
        )  # JSON is YAML
    )
    return path


def data_file(data_dir: Path, task: str) -> Path:
    folder = data_dir / "env" / BANK_PACK if task == "bank" else data_dir / task
    return folder / "test.parquet"


def _server_command(port: int, config: str | None) -> list[str]:
    script = Path(sys.executable).with_name("tool-server")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "tool_server.cli"]
    cmd += ["serve", "--host", "127.0.0.1", "--port", str(port)]
    return cmd + (["--config", config] if config else [])


@contextlib.contextmanager
def tool_server(
    log_path: Path, *, config: str | None = None, port: int = 0, startup_timeout_s: float = 180.0
) -> Iterator[str]:
    """Start ``tool-server serve`` on loopback, yield its base URL, and always stop it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        _server_command(port, config),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Its own process group: a terminal's Ctrl-C reaches the demo alone, which releases its
        # sessions and then stops the server (``_stop``), instead of both stopping at once.
        process_group=0,
    )
    found: list[str] = []
    announced = threading.Event()

    def pump() -> None:  # copy the server's output to its log; spot the address it binds
        assert proc.stdout is not None
        with open(log_path, "a") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                match = re.search(r"Uvicorn running on (http://\S+)", line)
                if match and not found:
                    found.append(match.group(1))
                    announced.set()
        announced.set()

    threading.Thread(target=pump, name="tool-server-log", daemon=True).start()
    try:
        url = _wait_ready(proc, found, announced, log_path, startup_timeout_s)
        yield url
    finally:
        _stop(proc)


def _wait_ready(
    proc: subprocess.Popen[str], found: list[str], announced: threading.Event, log: Path, timeout_s: float
) -> str:
    deadline = time.monotonic() + timeout_s
    announced.wait(timeout_s)
    if not found:
        raise CliError(f"the tool server did not start (exit code {proc.poll()}); see {log}:\n{_tail(log)}")
    url = found[0]
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CliError(f"the tool server exited with code {proc.returncode}; see {log}:\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return url
        time.sleep(0.2)
    raise CliError(f"the tool server at {url} was not ready within {timeout_s:.0f} s; see {log}")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()  # graceful: the server drains in-flight calls
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "".join(path.read_text().splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


# ----------------------------------------------------------------------------- rollouts


async def run_demo(
    args: argparse.Namespace, url: str, data_dir: Path, out_dir: Path, results: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Roll out every task; ``results`` (task -> records, wall s, file) fills as trajectories
    finish, so that an interrupted demo can still report what finished."""
    import torch

    from trainer_client.backends.hf import HFGenerator
    from trainer_client.backends.models import load_model
    from trainer_client.client.tool_client import ToolClient
    from trainer_client.rollout.core import RolloutConfig, RolloutCore

    torch.manual_seed(args.seed)
    generator: Any
    if args.engine == "vllm":
        tokenizer, generator = await vllm_generator(args)
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        _say(
            f"loading SmolLM2-135M-Instruct on {torch.get_num_threads()} torch thread(s) (first run converts the packaged GGUF, ~30 s)"
        )
        with interrupt_at_once():  # loading blocks the event loop: Ctrl-C must still stop it
            tokenizer, model = load_model(args.model)
        generator = HFGenerator(
            model, tokenizer, max_batch_size=args.batch_size, default_max_tokens=args.max_tokens
        )
    results = {} if results is None else results
    tasks = [t for t in TASKS if t.name in args.tasks]
    progress = GenerationProgress(
        len(tasks) * args.limit * args.n,
        args.max_turns * args.max_tokens,
        lambda: [
            r for name, result in results.items() if not name.startswith("_") for r in result["records"]
        ],
    )
    generator = progress.wrap(generator)
    async with ToolClient(url) as client:

        async def one(task: DemoTask) -> None:
            rows = load_tasks(data_file(data_dir, task.name), limit=args.limit)
            config = RolloutConfig(
                format=task.format,
                max_turns=args.max_turns,
                max_obs_tokens=args.max_obs_tokens,
                response_length=args.response_length,
                sampling_params={"temperature": args.temperature, "max_tokens": args.max_tokens},
                tool_result_template=task.tool_result_template,
                verifier=task.verifier,
                verifier_arguments=task.verifier_arguments,
            )
            core = RolloutCore(tokenizer, generator, client, config, verifier=client)
            tools_for = await tool_chooser(client, core, args.tool_schemas, None)
            out = out_dir / f"{task.name}.jsonl"
            finished: list[dict[str, Any]] = []
            results[task.name] = {"records": finished, "wall_s": None, "out": out}
            records, wall = await run_and_write(
                core,
                rows,
                args.n,
                out,
                verifier=task.verifier,
                concurrency=args.concurrency,
                progress=False,  # one line for all tasks (GenerationProgress), not a bar per task
                description=task.name,
                tools_for=tools_for,
                finished=finished,
            )
            results[task.name] = {"records": records, "wall_s": wall, "out": out}

        started = time.perf_counter()
        ticker = None if args.no_progress else asyncio.create_task(progress.run(_say))
        try:
            await asyncio.gather(*(one(t) for t in tasks))
        finally:  # also on Ctrl-C (cancelled): the figures of what finished, then generation stops
            if ticker is not None:
                ticker.cancel()
            results["_wall_s"] = time.perf_counter() - started
            results["_client"] = client.metrics()
            await generator.aclose()
    return results


# ----------------------------------------------------------------------------- main


def _say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer_client.demo",
        description="End-to-end demo: build the task data, start a tool server, roll out SmolLM2 on the "
        "search QA and arithmetic tasks and a bank environment through the batched client, score with the server's verifiers, "
        "print a summary, stop the server.",
    )
    parser.add_argument("--limit", type=int, default=6, help="prompts per task (default 6)")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt (default 2)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny run for smoke tests: 2 prompts per task, 1 sample, short turns",
    )
    parser.add_argument(
        "--tasks",
        default=",".join(t.name for t in TASKS),
        help=f"comma-separated tasks (default all: {', '.join(t.name for t in TASKS)})",
    )
    parser.add_argument("--out-dir", default="runs/demo", help="where data, logs and trajectories go")
    parser.add_argument("--model", default="smollm2", help="model name or local HF dir (default smollm2)")
    add_engine_arguments(parser, auto=True)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for --engine hf (default: 1 on a machine with 2 cores or fewer or a busy one, "
        "where a second thread slows generation down; else torch's default)",
    )
    parser.add_argument(
        "--server-config",
        default=None,
        help="tool-server YAML (default: the built-in config plus the bank environment; a config of your "
        "own must serve the tasks you ask for)",
    )
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    parser.add_argument("--max-tokens", type=int, default=96, help="new tokens per model turn (default 96)")
    parser.add_argument("--max-turns", type=int, default=3, help="model turns per trajectory (default 3)")
    parser.add_argument(
        "--max-obs-tokens", type=int, default=256, help="tokens per observation (default 256)"
    )
    parser.add_argument(
        "--response-length", type=int, default=768, help="response token budget (default 768)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="generation batch size (default 8)")
    parser.add_argument("--concurrency", type=int, default=16, help="trajectories in flight (default 16)")
    parser.add_argument(
        "--tool-schemas",
        choices=TOOL_SCHEMA_MODES,
        default="auto",
        help="tool schemas through the chat template (default auto: only where the template renders "
        "them and the prompt does not describe the tools already, so SmolLM2's prompts are unchanged)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    return parser


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM does what Ctrl-C does where the demo is: inside ``asyncio.run`` its handler
    cancels the rollouts (which release their sessions and stop generating); elsewhere it
    raises KeyboardInterrupt, so that the finally blocks stop the server."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.limit, args.n, args.max_tokens, args.max_turns = 2, 1, 48, 2
    args.tasks = {t.strip() for t in args.tasks.split(",") if t.strip()}
    unknown = args.tasks - {t.name for t in TASKS}
    if unknown or args.limit < 1 or args.n < 1:
        problem = f"unknown task(s) {sorted(unknown)}" if unknown else "--limit and --n must be at least 1"
        print(f"demo: error: {problem}; tasks: {', '.join(t.name for t in TASKS)}", file=sys.stderr)
        return 2
    try:
        check_model(args.model)  # a typo fails here, before the data is built or a server starts
    except CliError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    choice = choose_engine(args.engine, args.engine_url, installed=vllm_installed())
    args.engine = choice.engine
    if args.threads is None:
        args.threads = torch_threads(os.cpu_count(), _load_average())
    if args.threads == 1 and "torch" not in sys.modules:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool
    _say(choice.why)
    out_dir = Path(args.out_dir).expanduser()
    data_dir = out_dir / "data"
    # Ctrl-C keeps Python's handler, so that asyncio.run's own takes over during the rollouts:
    # it cancels them (the trajectories release their sessions, generation stops at the next
    # layer, what finished is reported) instead of raising in the middle of the event loop.
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _say(f"building task data into {data_dir}")
        with open(out_dir / "build.log", "w") as log:
            build_data(data_dir, log)
        server_log = out_dir / "server.log"
        if server_log.exists():
            server_log.unlink()
        _say(f"starting tool-server (log: {server_log})")
        config = args.server_config or str(server_config(out_dir))
        with tool_server(server_log, config=config) as url, contextlib.ExitStack() as engine:
            _say(f"tool server ready at {url}")
            try:
                engine.enter_context(engine_server(args))
            except CliError as exc:
                if not choice.automatic:
                    raise
                _say(
                    f"vLLM did not start ({str(exc).splitlines()[0]}); generating with HF transformers instead"
                )
                args.engine = "hf"
            asyncio.run(run_demo(args, url, data_dir, out_dir, results))
            _say("stopping the tool server")
        overall = report(results)
    except (CliError, FileNotFoundError) as exc:  # FileNotFoundError: the model or a data file
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if any(r["records"] for name, r in results.items() if not name.startswith("_")):
            report(results, interrupted=True)
        print("demo: interrupted; the tool server was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    _say(f"done in {time.perf_counter() - started:.0f} s")
    return 0 if overall["trajectories"] and not overall["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
