"""The learning examples (examples/learn_arithmetic.py, learn_environment.py) as a user runs them.

- With no flags they reproduce their published run: the trainer config their defaults make
  equals the one recorded in examples/results/<name>.json, field for field.
- ``--help`` lists ``--port``; a tiny real run (SmolLM2 on the CPU, a real tool server on the
  port given) says what it is doing from the start: the data, the server, the trainer's plan,
  then rollout progress lines, all before the first held-out evaluation ends (the order of
  the lines is checked, never the time).
- One Ctrl-C (SIGINT) or a SIGTERM stops a run in its first evaluation: exit 130, one line
  saying so, no traceback, and the run's tool server is stopped too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import signal
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.support.processes import RunningProcess, started, with_default_sigint
from tests.support.require import require
from tests.support.server import REPO

pytestmark = pytest.mark.timeout(900)

EXAMPLES = REPO / "examples"
EXIT_BOUND_S = 120  # after one signal; a run would go on for an hour
# The smallest run: two held-out problems, one step of one prompt x 2 samples, no checkpoint.
TINY = [
    "--steps", "1", "--prompts-per-step", "1", "--group-size", "2", "--micro-batch-size", "2",
    "--eval-size", "2", "--eval-samples", "1", "--eval-every", "0", "--save-every", "0",
    "--threads", "1", "--max-minutes", "0",
]  # fmt: skip


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def script(name: str, *args: str) -> list[str]:
    return with_default_sigint([sys.executable, str(EXAMPLES / f"{name}.py"), *args])


def trainer_config(argv: list[str]) -> dict[str, Any]:
    """The GRPOConfig that ``trainer-client train argv`` runs, as JSON values."""
    from trainer_client.cli.train import config_from_args, configure

    parser = argparse.ArgumentParser()
    configure(parser.add_subparsers(dest="command").add_parser("train"))
    return json.loads(json.dumps(asdict(config_from_args(parser.parse_args(argv))), default=str))


@pytest.mark.parametrize("name", ["learn_arithmetic", "learn_environment", "learn_multistep"])
def test_the_defaults_are_the_published_runs_flags(name: str) -> None:
    require("verl", "the trainer's config (trainer extra)")
    module = load(name)
    args = module.build_parser().parse_args([])
    url, train, test = "http://127.0.0.1:1", Path("train.parquet"), Path("test.parquet")
    if name in ("learn_environment", "learn_multistep"):
        argv = module.train_argv(args, url, module.pack(**module.pack_arguments(args)).id, train, test)
    else:
        argv = module.train_argv(args, url, train, test)
    config = module._run.run_relative(trainer_config(argv), args.out)
    published = json.loads((EXAMPLES / "results" / f"{name}.json").read_text())["config"]
    assert set(published) <= set(config), "a published setting the trainer no longer has"
    differ = {key: (value, config[key]) for key, value in published.items() if config[key] != value}
    assert differ == {}, f"(published, default) of the settings that differ: {differ}"


@pytest.mark.parametrize("name", ["learn_arithmetic", "learn_environment"])
def test_help_lists_the_port_and_the_defaults(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--port PORT" in done.stdout and "the tool server's port (default: a free one" in done.stdout


def test_a_taken_port_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "learn_arithmetic.py"), "--port", str(port), "--n-train", "4",
             "--out", str(tmp_path / "run")],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"error: --port {port}: cannot listen there" in done.stderr
    assert "leave --port out for a free one" in done.stderr and "Traceback" not in done.stderr


def positions(output: str, patterns: list[str]) -> list[int]:
    """Where each pattern first matches in ``output`` (fails naming the first one missing)."""
    found = []
    for pattern in patterns:
        match = re.search(pattern, output)
        assert match is not None, f"no line matching {pattern!r} in:\n{output[-6000:]}"
        found.append(match.start())
    return found


def test_a_tiny_run_says_what_it_does_before_the_first_evaluation_ends(tmp_path: Path) -> None:
    """Read until the first evaluation ends, then stop the run (one Ctrl-C): what would come
    after (a step and the end's evaluations) is not what this test is about."""
    require("verl", "the trainer (trainer extra)")
    port = free_port()
    cmd = script(
        "learn_arithmetic", *TINY, "--n-train", "8", "--port", str(port), "--out", str(tmp_path / "run")
    )
    with started(cmd, ready_line=r"eval at step 0: success", timeout_s=840, cwd=REPO) as process:
        output = process.output
        assert (tmp_path / "run" / "metrics.jsonl").is_file()
        assert_stopped(process, port, signal.SIGINT)
    order = positions(
        output,
        [
            r"\[ *\d+ s\] building the arithmetic task: 8 training and 200 held-out problems",
            rf"\[ *\d+ s\] starting the tool server on 127\.0\.0\.1:{port} \(--port\)",
            rf"\[ *\d+ s\] tool server ready at http://127\.0\.0\.1:{port}",
            r"\[ *\d+ s\] trainer: loads SmolLM2-135M-Instruct .*evaluates the untrained model \(2 held-out tasks",
            r"trainer-client train --server",  # the command, printed to repeat it by hand
            r"rollout: 2 trajectories started",
            r"rollout: 2/2 trajectories done in",
            r"eval at step 0: success",  # the first evaluation ends
        ],
    )
    assert order == sorted(order), f"the lines came in another order:\n{output[-6000:]}"


def assert_stopped(process: RunningProcess, port: int, signum: int) -> None:
    process.proc.send_signal(signum)
    try:
        code = process.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"still running {EXIT_BOUND_S} s after {signal.Signals(signum).name}:\n{process.output[-4000:]}"
        )
    output = process.output
    assert code == 130, output[-4000:]
    assert "Traceback" not in output and "could not release" not in output, output[-4000:]
    assert "interrupted" in output
    with pytest.raises(httpx.TransportError):  # the run's tool server went with it
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_one_ctrl_c_stops_a_run_and_its_tool_server(tmp_path: Path) -> None:
    require("verl", "the trainer (trainer extra)")
    port = free_port()
    cmd = script("learn_arithmetic", *TINY, "--eval-size", "16", "--n-train", "8", "--port", str(port),
                 "--out", str(tmp_path / "run"))  # fmt: skip
    with started(cmd, ready_line=r"rollout: \d+ trajectories started", timeout_s=600, cwd=REPO) as process:
        assert_stopped(process, port, signal.SIGINT)


def test_sigterm_stops_a_run_and_its_tool_server(tmp_path: Path) -> None:
    require("verl", "the trainer (trainer extra)")
    port = free_port()
    cmd = script("learn_environment", *TINY, "--eval-size", "16", "--tasks", "40", "--port", str(port),
                 "--out", str(tmp_path / "run"))  # fmt: skip
    with started(cmd, ready_line=r"rollout: \d+ trajectories started", timeout_s=600, cwd=REPO) as process:
        assert_stopped(process, port, signal.SIGTERM)
    assert f"received signal {int(signal.SIGTERM)}; stopping" in process.output
