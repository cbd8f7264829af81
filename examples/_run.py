"""What the learning-run scripts share: a tool server for the run, the printed command, the
published figures.

    with tool_server(out, SERVER_CONFIG) as url:
        code = run_trainer(argv)
    publish(out, "learn_something")
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "examples" / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def tool_server(out: Path, config: dict[str, Any]) -> Iterator[str]:
    """``tool-server serve`` with ``config`` on a free port; yields its URL, stops it after."""
    path = out / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(out / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", str(port)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"tool server exited with {proc.returncode}; see {out / 'server.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError("tool server did not become healthy within 120 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def run_trainer(argv: list[str]) -> int:
    """``trainer-client train`` with ``argv`` (printed first, so the run can be repeated by hand)."""
    from trainer_client import train_cli

    print("trainer-client " + " ".join(f"'{a}'" if " " in a or "{" in a else a for a in argv), flush=True)
    return train_cli.main(argv)


def publish(out: Path, name: str) -> None:
    """Copy the plot and a JSON of the figures to examples/results/ (committed with the README)."""
    from trainer_client.summary import summarize_run

    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = summarize_run(out / "metrics.jsonl")
    summary["config"] = json.loads((out / "config.json").read_text())
    for key in ("server", "train_data", "eval_data", "out_dir"):
        summary["config"].pop(key, None)
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    if (out / "reward_curve.png").is_file():
        shutil.copy(out / "reward_curve.png", RESULTS / f"{name}.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))


def exit_on_sigterm() -> None:
    """SIGTERM (kill PID) unwinds like Ctrl-C, so the run's tool server is stopped too."""

    def handler(signum: int, _frame: object) -> None:
        print(f"received signal {signum}; stopping", file=sys.stderr, flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
