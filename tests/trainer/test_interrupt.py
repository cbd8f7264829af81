"""One Ctrl-C stops ``trainer-client rollout``: generation stops, what finished is written with
its summary, the sessions are released, and it exits 130 without a traceback.

Real processes: a tool server, and ``trainer-client rollout`` started with SIGINT at its
default (as a terminal's Ctrl-C finds it), sent one SIGINT. The runs would take many
minutes; each must end within a bound far shorter (a timeout on ``wait``, not a timing
assertion).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.processes import RunningProcess, started, with_default_sigint
from tests.support.require import require
from tests.support.server import REPO, running_server, server_config

pytestmark = pytest.mark.timeout(600)

EXIT_BOUND_S = 90  # after one SIGINT; the runs below would go on for many minutes
COUNTING = "Count from 1 to 5000, writing every number, separated by commas. Do not stop early."


def write_rows(path: Path, prompts: list[str]) -> Path:
    import pandas as pd

    rows = [
        {
            "data_source": "interrupt",
            "prompt": [{"role": "user", "content": prompt}],
            "reward_model": {"ground_truth": "x"},
            "extra_info": {"index": i},
        }
        for i, prompt in enumerate(prompts)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def rollout(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("trainer-client")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "trainer_client.cli.command"]
    return with_default_sigint([*cmd, "rollout", *args])


def interrupt(process: RunningProcess) -> int:
    process.proc.send_signal(signal.SIGINT)
    try:
        return process.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_BOUND_S} s after one SIGINT:\n{process.output[-3000:]}")


def sessions_open(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("toolfactory_sessions "):
            return float(line.split()[1])
    raise AssertionError("no toolfactory_sessions gauge in /metrics")


def assert_interrupted(process: RunningProcess, code: int, out: Path, planned: int) -> dict[str, Any]:
    output = process.output
    assert code == 130, output[-3000:]
    assert "trainer-client: interrupted" in output
    assert "Traceback" not in output and "terminate called" not in output, output[-3000:]
    assert f"interrupted, 0 of {planned} trajectories finished" in output
    summary = orjson.loads(out.with_suffix(".summary.json").read_bytes())
    assert summary["interrupted"] is True and summary["planned_trajectories"] == planned
    assert summary["trajectories"] == len(out.read_bytes().splitlines())  # the records that finished
    return summary


@pytest.fixture(scope="module")
def server() -> Any:
    with running_server(server_config()) as srv:
        yield srv


def test_one_ctrl_c_stops_generation_of_the_real_model(server: Any, tmp_path: Path) -> None:
    """SmolLM2 counts to 5000 greedily (8000 new tokens per trajectory: many minutes on a CPU);
    one SIGINT once generation runs ends the run within the bound: the decode thread stops at
    its next layer instead of finishing its batch."""
    require("transformers", "the rollout generates with SmolLM2 (trainer extra)")
    data = write_rows(tmp_path / "count.parquet", [COUNTING, COUNTING])
    out = tmp_path / "count.jsonl"
    cmd = rollout(
        "--server", server.url, "--data", str(data), "--n", "2", "--temperature", "0",
        "--max-tokens", "8000", "--response-length", "8100", "--max-turns", "1",
        "--batch-size", "4", "--concurrency", "4", "--no-progress", "--out", str(out),
    )  # fmt: skip
    # The output file is opened when the rollout starts, after the model has loaded.
    with started(cmd, probe=out.exists, timeout_s=300, cwd=REPO) as process:
        time.sleep(5)  # into the first batch's prefill or decode
        code = interrupt(process)
    assert_interrupted(process, code, out, planned=4)


def test_one_ctrl_c_releases_the_sessions_of_running_trajectories(server: Any, tmp_path: Path) -> None:
    """Four scripted trajectories each wait on a 50 s tool call in their session; one SIGINT
    ends the run, and every session is released on the server (its TTL is 15 minutes: only
    the client's release closes them this soon)."""
    require("transformers", "the scripted rollout renders turns with the SmolLM2 tokenizer (trainer extra)")
    data = write_rows(tmp_path / "slow.parquet", [f"task {i}" for i in range(4)])
    call = '<tool_call>{"name": "sleep", "arguments": {"seconds": 50}}</tool_call>'
    script = tmp_path / "turns.jsonl"
    script.write_bytes(orjson.dumps({"turns": [call, call, "<answer>x</answer>"]}) + b"\n")
    out = tmp_path / "slow.jsonl"
    cmd = rollout(
        "--server", server.url, "--data", str(data), "--script", str(script), "--max-turns", "3",
        "--no-progress", "--out", str(out),
    )  # fmt: skip
    with started(cmd, probe=lambda: sessions_open(server.url) == 4, timeout_s=180, cwd=REPO) as process:
        code = interrupt(process)
    assert_interrupted(process, code, out, planned=4)
    assert sessions_open(server.url) == 0
