"""One flag puts vLLM behind the commands: ``trainer-client rollout --engine vllm``, the demo
and ``trainer-client train --engine vllm`` (generation on vLLM, update on the HF policy,
weights reloaded by vLLM before each step), each run as a user runs it, against the shared
real vLLM server and a real tool server."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.engines.conftest import reload_weights
from tests.support.server import REPO, ServerProcess, running_server, server_config
from trainer_client.backends.vllm_server import LocalVLLMServer

pytestmark = pytest.mark.timeout(1800)

VERIFIERS = [
    {"target": "tools.verifiers.math:math_equal"},
    {"target": "tools.verifiers.format:format_check"},
    {"target": "tools.verifiers.weighted:weighted"},
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools.data import arithmetic, write_parquet

    folder = tmp_path_factory.mktemp("arithmetic")
    for split, rows in arithmetic.build_rows(n_train=6, n_test=4, seed=2).items():
        write_parquet(rows, folder / f"{split}.parquet")
    return folder


@pytest.fixture(scope="module")
def tool_server() -> Iterator[ServerProcess]:
    with running_server(server_config(verifiers=VERIFIERS)) as server:
        yield server


def cli(
    *args: str, timeout_s: float = 900.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer_client.cli.command", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_without_a_vllm_environment_the_error_says_how_to_make_one(tmp_path: Path) -> None:
    from tools.data import arithmetic, write_parquet

    rows = write_parquet(arithmetic.build_rows(n_train=0, n_test=1, seed=0)["test"], tmp_path / "t.parquet")
    done = cli(
        "rollout", "--server", "http://127.0.0.1:9", "--data", str(rows), "--engine", "vllm",
        env={"TOOLFACTORY_VLLM_PYTHON": str(tmp_path / "no-such-venv" / "bin" / "python")},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no vLLM environment" in done.stderr and "make vllm" in done.stderr, done.stderr


def test_rollout_with_engine_vllm(
    vllm_server: LocalVLLMServer, tool_server: ServerProcess, data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rollout.jsonl"
    done = cli(
        "rollout", "--server", tool_server.url, "--data", str(data / "test.parquet"),
        "--engine", "vllm", "--engine-url", vllm_server.url,
        "--format", "hermes", "--verifier", "math_equal", "--limit", "4", "--n", "2",
        "--max-tokens", "64", "--max-turns", "3", "--temperature", "0.7", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8
    for record in records:
        assert record.get("error") is None, record.get("error")
        assert 1 in record["response_mask"] and len(record["response_mask"]) == len(record["response_ids"])
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["trajectories"] == 8
    print(f"\nrollout on vLLM: {done.stdout[-1500:]}")


def test_the_demo_with_engine_vllm(vllm_server: LocalVLLMServer, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_client.demo",
            "--quick",
            "--engine",
            "vllm",
            "--engine-url",
            vllm_server.url,
            "--out-dir",
            str(tmp_path / "demo"),
            "--no-progress",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "== all tasks" in done.stdout
    for task in ("search_qa", "arithmetic", "bank"):
        assert (tmp_path / "demo" / f"{task}.jsonl").stat().st_size > 0


def test_train_with_engine_vllm_pushes_each_steps_weights(
    vllm_server: LocalVLLMServer,
    packaged_weights: Path,
    tool_server: ServerProcess,
    data: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    try:
        done = cli(
            "train", "--server", tool_server.url, "--train-data", str(data / "train.parquet"),
            "--engine", "vllm", "--engine-url", vllm_server.url, "--out-dir", str(out),
            "--steps", "2", "--prompts-per-step", "1", "--group-size", "2", "--micro-batch-size", "2",
            "--max-turns", "2", "--max-tokens-per-turn", "32", "--response-length", "96",
            "--temperature", "0.9", "--lr", "1e-4", "--entropy-coeff", "0.01",
            "--verifier", "weighted", "--verifier-args", json.dumps({"verifiers": {"math_equal": 1.0, "format": 0.1}}),
            "--save-every", "1", "--eval-every", "0", "--no-eval-at-start", "--no-plot", "--no-tensorboard",
            "--threads", "1",
        )  # fmt: skip
    finally:
        reload_weights(vllm_server, packaged_weights)  # the shared server serves the packaged model again
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["time/weight_sync_s"] > 0 and r["rollout_tokens_per_s"] > 0 for r in steps)
    print(f"\nweight sync per step (save + reload): {[round(r['time/weight_sync_s'], 2) for r in steps]} s")

    # Step 2 sampled from the policy step 1 left: what vLLM loaded last is that checkpoint, in
    # bfloat16, tied output head written out. (Whether step 1 changed the policy depends on the
    # rewards it drew; the push is checked either way.)
    from safetensors.torch import load_file

    pushed = load_file(out / "vllm_weights" / "model.safetensors")
    after_step_1 = load_file(out / "checkpoints" / "step_000001" / "model.safetensors")
    assert all(pushed[k].dtype == torch.bfloat16 for k in pushed)
    assert set(after_step_1) <= set(pushed) and "lm_head.weight" in pushed
    for name, tensor in after_step_1.items():
        assert torch.equal(pushed[name], tensor.to(torch.bfloat16)), name
    assert torch.equal(pushed["lm_head.weight"], after_step_1["model.embed_tokens.weight"].to(torch.bfloat16))
    start = load_file(packaged_weights / "model.safetensors")
    moved = sum(int((pushed[k] != start[k].to(torch.bfloat16)).sum()) for k in start)
    print(
        f"weights that changed in bfloat16 after one step: {moved} of {sum(t.numel() for t in start.values())}"
    )


def test_serve_model_refuses_what_it_cannot_do_safely(tmp_path: Path) -> None:
    """``trainer-client serve-model`` (``make model-server``): no vLLM environment is an error
    that says how to make one; the weight-sync endpoints (which read any path) only on loopback."""
    done = cli("serve-model", "--python", str(tmp_path / "none" / "bin" / "python"), timeout_s=300)
    assert done.returncode == 2 and "make vllm" in done.stderr, done.stderr
    done = cli("serve-model", "--weight-sync", "--host", "0.0.0.0", timeout_s=300)
    assert done.returncode == 2 and "127.0.0.1 only" in done.stderr, done.stderr


def test_a_killed_parent_leaves_no_server_behind(tmp_path: Path) -> None:
    """The vLLM server runs in its own process group (so stopping it reaches its engine core);
    a trainer killed with SIGKILL runs no cleanup, yet its server must not outlive it."""
    import signal
    import time

    fake = tmp_path / "venv" / "bin" / "python"  # stands in for vLLM: a process that would run on
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'server.pid'}\nexec sleep 600\n")
    fake.chmod(0o755)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from pathlib import Path\n"
            "from trainer_client.backends.vllm_server import VLLMServerSettings, local_vllm_server\n"
            "with local_vllm_server(VLLMServerSettings(Path('.')), startup_timeout_s=600):\n"
            "    pass\n",
        ],  # fmt: skip
        cwd=REPO,
        env={**os.environ, "TOOLFACTORY_VLLM_PYTHON": str(fake)},
    )
    pid_file = tmp_path / "server.pid"
    try:
        for _ in range(600):  # until the stand-in has started (generous: a loaded machine)
            if pid_file.is_file() and pid_file.read_text().strip():
                break
            time.sleep(0.1)
        server = int(pid_file.read_text())
        assert running(server)
        parent.send_signal(signal.SIGKILL)
        parent.wait(60)
        for _ in range(600):
            if not running(server):
                break
            time.sleep(0.1)
        assert not running(server), "the server outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid_file.is_file():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def running(pid: int) -> bool:
    """The process exists and is not a zombie (one not reaped yet has exited all the same)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
