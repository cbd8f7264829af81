"""``python -m trainer_client.demo``: end to end, and the server is always stopped."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.demo import QuickDemo
from tests.support.processes import started, with_default_sigint

REPO = Path(__file__).resolve().parents[2]


def demo(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer_client.demo", *args]


def server_url(out_dir: Path) -> str:
    match = re.search(r"Uvicorn running on (http://\S+)", (out_dir / "server.log").read_text())
    assert match, "the demo's server never announced its address"
    return match.group(1)


def assert_stopped(url: str) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz", timeout=5)


@pytest.mark.timeout(900)  # three tasks of generation on a CPU, beside whatever else the machine runs
def test_quick_demo_end_to_end(quick_demo: QuickDemo) -> None:
    done, out_dir = quick_demo.done, quick_demo.out_dir
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== all tasks" in done.stdout and "trajectories                    6 (6 prompts)" in done.stdout
    for task in ("search_qa", "arithmetic", "bank"):
        records = [orjson.loads(line) for line in (out_dir / f"{task}.jsonl").read_bytes().splitlines()]
        assert len(records) == 2
        assert all(r["reward"] is not None and r["error"] is None for r in records), records
    for task in ("search_qa", "arithmetic"):
        assert (out_dir / "data" / task / "test.parquet").is_file()
    # the environment: each trajectory played its own task's world, scored by tool_use's components
    bank = [orjson.loads(line) for line in (out_dir / "bank.jsonl").read_bytes().splitlines()]
    assert all(r["ground_truth"]["pack"] == "demo-bank" for r in bank)
    assert all({"calls", "state", "answer", "format"} <= set(r["reward_components"]) for r in bank), bank
    assert "trainer-client show" in done.stdout
    assert_stopped(server_url(out_dir))


def test_a_model_typo_fails_in_one_line_before_any_work(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo"
    done = subprocess.run(
        demo("--quick", "--out-dir", str(out_dir), "--model", "smolm2"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "demo: error: unknown model 'smolm2' (did you mean 'smollm2'?); choose from: smollm2, "
        "or a local Hugging Face model directory (no model hub is reachable)"
    ]
    assert not (out_dir / "server.log").exists() and not (out_dir / "data").exists()


def test_server_is_stopped_when_the_demo_fails(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo"
    done = subprocess.run(  # no vLLM answers on port 9: the demo fails after its server started
        demo("--quick", "--out-dir", str(out_dir), "--engine", "vllm", "--engine-url", "http://127.0.0.1:9"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "demo: error:" in done.stderr
    assert_stopped(server_url(out_dir))


def test_server_is_stopped_on_interrupt(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo"
    log = out_dir / "server.log"
    with started(
        # HF: with the default engine (auto) a machine with .venv-vllm would start a vLLM server
        # here, outside the one shared vLLM test group, and stopping it mid-start took over 60 s
        with_default_sigint(demo("--quick", "--engine", "hf", "--out-dir", str(out_dir), "--no-progress")),
        probe=lambda: log.exists() and "Uvicorn running" in log.read_text(),
        timeout_s=180,
        cwd=REPO,
    ) as process:
        url = server_url(out_dir)
        process.proc.send_signal(signal.SIGINT)  # Ctrl-C reaches the demo only, not its server
        process.wait(180)  # generous: a loaded machine
    assert process.proc.returncode == 130, process.output
    assert "interrupted" in process.output
    # a clean stop: no traceback, no "coroutine ... was never awaited" on the way out
    assert "Traceback" not in process.output and "RuntimeWarning" not in process.output, process.output
    assert_stopped(url)
