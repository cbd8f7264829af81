"""What the learning-run scripts share: their options, a tool server for the run, the printed
command, what is happening (on stderr, from the first second), the published figures.

    say("building the data ...")
    with tool_server(out, SERVER_CONFIG, args.port) as url:
        say_plan(args)
        code = run_trainer(argv)
    publish(out, "learn_something")
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "examples" / "results"
PROCEDURAL_PACK = "tools.envs.procedural:pack"


_STARTED = time.monotonic()


class ExampleError(RuntimeError):
    """What stops a learning run before training, said to the user (``main_interruptible``)."""


def say(message: str) -> None:
    """One line on stderr: seconds since the script started, then what is happening."""
    print(f"[{time.monotonic() - _STARTED:5.0f} s] {message}", file=sys.stderr, flush=True)


def add_schedule_options(
    parser: argparse.ArgumentParser,
    *,
    out: str,
    temperature: float,
    eval_size: int,
    eval_every: int,
    threads: int,
    eval_samples: int = 1,
    max_minutes: float | None = None,
    prompts_per_step: int = 8,
    steps: int = 40,
    group_size: int = 6,
    lr: float = 2e-5,
    engine: str = "hf",
) -> argparse.ArgumentParser:
    """The options every learning run has (the defaults that differ are arguments: a script
    sets them to the flags of its published run, so that it reproduces that run as it is)."""
    parser.add_argument("--out", type=Path, default=REPO / "runs" / out)
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="the tool server's port (default: a free one, printed at the start)",
    )
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--prompts-per-step", type=int, default=prompts_per_step)
    parser.add_argument("--group-size", type=int, default=group_size)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument(
        "--temperature", type=float, default=temperature, help="training and held-out sampling"
    )
    parser.add_argument("--eval-samples", type=int, default=eval_samples, help="samples per held-out problem")
    parser.add_argument("--eval-size", type=int, default=eval_size)
    parser.add_argument("--eval-every", type=int, default=eval_every, help="0: at the start and the end only")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=threads, help="torch threads")
    parser.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default=engine,
        help="rollouts on hf (in process) or vllm (.venv-vllm: `make vllm`)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=max_minutes,
        help="time budget: no new step after it (the evaluations at the start count; 0: none)",
    )
    parser.add_argument("--pilot", action="store_true", help="3 steps, 16 held-out problems")
    parser.add_argument("--publish", default=None, help="name under examples/results/ (default: none)")
    return parser


def parse_schedule(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parsed options (``--pilot``: 3 steps, 16 held-out problems) with the run folder made."""
    args = parser.parse_args(argv)
    if args.pilot:
        args.steps, args.eval_size, args.eval_every, args.eval_samples = 3, 16, 3, 1
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def schedule_flags(args: argparse.Namespace, *, greedy_only: bool = False) -> list[str]:
    """The ``trainer-client train`` flags of the shared options.

    Held-out evaluation: sampled at ``--temperature``, then greedy; ``greedy_only``: greedy
    alone (one evaluation per checkpoint instead of two).
    """
    eval_temperature, greedy = (
        ("0", "--no-greedy-eval") if greedy_only else (str(args.temperature), "--greedy-eval")
    )
    flags = [
        "--out-dir", str(args.out),
        "--steps", str(args.steps),
        "--prompts-per-step", str(args.prompts_per_step),
        "--group-size", str(args.group_size),
        "--micro-batch-size", str(args.micro_batch_size),
        "--lr", str(args.lr),
        "--temperature", str(args.temperature),
        "--eval-temperature", eval_temperature,
        "--eval-samples", str(args.eval_samples),
        greedy,
        "--eval-size", str(args.eval_size),
        "--eval-every", str(args.eval_every),
        "--save-every", str(args.save_every),
        "--threads", str(args.threads),
        "--seed", str(args.seed),
        "--verbose",
    ]  # fmt: skip
    if args.max_minutes:
        flags += ["--max-minutes", str(args.max_minutes)]
    if args.engine != "hf":
        flags += ["--engine", args.engine]  # the trainer starts vLLM and pushes weights each step
    return flags


def pack_arguments(args: argparse.Namespace, levels: list[int]) -> dict[str, object]:
    """The arguments of the procedural pack of a run (``--world``, ``--seed``, ``--tasks``) at
    ``levels``: the server builds the same pack (same id) from them."""
    from tools.envs.procedural import world_module

    # parameter_expansion 0: no optional arguments in the gold calls (a 135M model copies
    # the shown arguments; an optional filter it was never shown is out of its reach).
    # Every task exposes every tool of the world (the rest as distractors): then every
    # prompt has the same system text and worked examples, the generator computes that
    # shared prefix once per batch, and a step takes minutes instead of ten.
    return {
        "world": args.world,
        "seed": args.seed,
        "tasks": args.tasks,
        "levels": levels,
        "distractors": len(world_module(args.world).TOOLS),
        "toolset_extension": 1.0,
        "parameter_expansion": 0.0,
    }


def few_shot_splits(
    pack: Any, args: argparse.Namespace, levels: list[int], shots: int, **prompt: Any
) -> dict[str, list[dict[str, Any]]]:
    """The train/test rows of a procedural pack at ``levels``, as ``python -m tools.data build
    --tasks env:...`` builds them (``--seed``, ``--test-fraction``), with few-shot text prompts:
    SmolLM2's chat template renders neither tool schemas nor ``tool_calls``, so the tools, the
    call format and ``shots`` worked examples are written out (``prompt``: ``few_shot_rows``'s
    options, e.g. ``example_levels``, ``call_format``)."""
    from tools.data.env_prompts import few_shot_rows
    from tools.data.environments import build_rows

    rows = build_rows(pack, seed=args.seed, test_fraction=args.test_fraction, levels=levels)
    return few_shot_rows(pack, rows, shots, levels, args.seed, **prompt)


def procedural_server_config(arguments: dict[str, object]) -> dict[str, object]:
    """A tool server that serves the procedural pack of ``arguments`` (``pack_arguments``): its
    tools as the toolset ``<pack id>``, and the ``tool_use`` verifier."""
    return {
        "server": {"shutdown_grace_s": 2, "log_level": "warning"},
        "environments": [{"source": PROCEDURAL_PACK, "arguments": arguments}],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check_port(port: int) -> None:
    """ExampleError when ``port`` cannot be had on loopback (taken, or not a port)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except (OSError, OverflowError) as exc:
            raise ExampleError(
                f"--port {port}: cannot listen there ({exc}); choose another, or leave --port out for a free one"
            ) from None


@contextlib.contextmanager
def tool_server(out: Path, config: dict[str, Any], port: int | None = None) -> Iterator[str]:
    """``tool-server serve`` with ``config`` on ``port`` (default: a free one); yields its URL,
    stops it after."""
    path = out / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    if port is None:
        port = free_port()
        chosen = "a free port; --port to choose one"
    else:
        _check_port(port)
        chosen = "--port"
    say(f"starting the tool server on 127.0.0.1:{port} ({chosen}); its log: {out / 'server.log'}")
    log = open(out / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", str(port)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its own process group: a terminal's Ctrl-C reaches the run alone, which releases its
        # sessions and then stops the server here.
        process_group=0,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ExampleError(f"the tool server exited with {proc.returncode}; see {out / 'server.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise ExampleError(
                f"the tool server did not become healthy within 120 s; see {out / 'server.log'}"
            )
        say(f"tool server ready at {url}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def say_plan(args: argparse.Namespace) -> None:
    """What the trainer is about to do, in order, before it starts (its own log follows)."""
    evaluation = f"{args.eval_size} held-out tasks x {args.eval_samples} sample(s) at T = {args.temperature}, then greedy"
    every = f"every {args.eval_every} steps and " if args.eval_every else ""
    budget = f"; time budget {args.max_minutes:g} min" if args.max_minutes else ""
    if (args.out / "checkpoints" / "latest").is_file():  # the trainer resumes, without a new baseline
        say(
            f"trainer: loads SmolLM2-135M-Instruct (~30 s), resumes from the last checkpoint in {args.out}{budget}"
        )
        return
    say(
        f"trainer: loads SmolLM2-135M-Instruct (~30 s), evaluates the untrained model ({evaluation}), "
        f"then {args.steps} training step(s) of {args.prompts_per_step} prompt(s) x {args.group_size} samples, "
        f"evaluating {every}at the end{budget}; progress lines follow (rollout: done/total, time left)"
    )


def run_trainer(argv: list[str]) -> int:
    """``trainer-client train`` with ``argv`` (printed first, so the run can be repeated by hand).

    Ctrl-C (or SIGTERM, see ``exit_on_sigterm``): the trainer's ``asyncio.run`` cancels the
    run, which stops generating and releases its sessions; 130 then, not a traceback.
    """
    from trainer_client.cli import train as train_cli

    print("trainer-client " + " ".join(f"'{a}'" if " " in a or "{" in a else a for a in argv), flush=True)
    try:
        return train_cli.main(argv)
    except KeyboardInterrupt:
        print(interrupted_message(_out_dir(argv)), file=sys.stderr, flush=True)
        return 130


def run_sft(argv: list[str]) -> int:
    """``trainer-client sft`` with ``argv`` (printed first, as ``run_trainer`` does)."""
    from trainer_client.cli import sft as sft_cli

    print("trainer-client " + " ".join(f"'{a}'" if " " in a or "{" in a else a for a in argv), flush=True)
    parser = argparse.ArgumentParser(prog="trainer-client")
    sft_cli.configure(parser)
    try:
        return sft_cli.run(parser.parse_args(argv[1:]))
    except KeyboardInterrupt:
        print("interrupted during the warm start", file=sys.stderr, flush=True)
        return 130


def interrupted_message(out_dir: Path | None) -> str:
    """Where the finished steps are, if any finished: metrics.jsonl exists only after the first."""
    metrics = out_dir / "metrics.jsonl" if out_dir is not None else None
    if metrics is not None and metrics.is_file() and metrics.stat().st_size:
        return f"interrupted: the steps that finished are in {metrics}"
    return "interrupted before the first training step finished: nothing was written"


def _out_dir(argv: list[str]) -> Path | None:
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--out-dir":
            return Path(value)
    return None


def run_relative(config: dict[str, Any], out: Path) -> dict[str, Any]:
    """``config`` with each path inside the run folder written as ``<out>/...`` (e.g. a warm start's
    ``<out>/sft/model``): the published flags then compare with the defaults whatever ``--out`` was."""
    root = out.resolve()
    relative = {}
    for key, value in config.items():
        if isinstance(value, str) and value and Path(value).resolve().is_relative_to(root):
            value = f"<out>/{Path(value).resolve().relative_to(root).as_posix()}"
        relative[key] = value
    return relative


def publish(out: Path, name: str) -> None:
    """Copy the plot and a JSON of the figures to examples/results/ (committed with the README)."""
    from trainer_client.rollout.summary import summarize_run

    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = summarize_run(out / "metrics.jsonl")
    summary["config"] = run_relative(json.loads((out / "config.json").read_text()), out)
    for key in ("server", "train_data", "eval_data", "out_dir"):
        summary["config"].pop(key, None)
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    if (out / "reward_curve.png").is_file():
        shutil.copy(out / "reward_curve.png", RESULTS / f"{name}.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))


def exit_on_sigterm() -> None:
    """SIGTERM (kill PID) does what Ctrl-C does where the run is, so the run's tool server is
    stopped too: inside ``asyncio.run`` its handler cancels the run (generation stops, sessions
    are released); elsewhere Python's raises KeyboardInterrupt."""

    def handler(signum: int, frame: Any) -> None:
        print(f"received signal {signum}; stopping", file=sys.stderr, flush=True)
        on_interrupt = signal.getsignal(signal.SIGINT)
        if not callable(on_interrupt):  # SIGINT ignored (started in the background): stop anyway
            raise KeyboardInterrupt
        on_interrupt(signal.SIGINT, frame)

    signal.signal(signal.SIGTERM, handler)


def main_interruptible(main: Callable[[], int]) -> int:
    """``main()``, with Ctrl-C outside the training itself (building data, starting the server)
    ending the run with one line and 130 instead of a traceback, and an ``ExampleError`` with
    its message and 1."""
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except ExampleError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
