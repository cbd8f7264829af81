"""One flag puts vLLM behind the commands: ``trainer-client rollout --engine vllm``, the demo
and ``trainer-client train --engine vllm`` (generation on vLLM, update on the HF policy,
weights reloaded by vLLM before each step), each run as a user runs it, against the shared
real vLLM server and a real tool server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
            "--save-every", "0", "--eval-every", "0", "--no-eval-at-start", "--no-plot", "--no-tensorboard",
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

    # step 2 sampled from the weights step 1 made: what vLLM last loaded differs from the start.
    # (One AdamW step at lr 1e-4 moves a weight by ~1e-4, below bfloat16's resolution for most
    # of them: the served policy follows the float32 master as its changes add up.)
    from safetensors.torch import load_file

    pushed = load_file(out / "vllm_weights" / "model.safetensors")
    start = load_file(packaged_weights / "model.safetensors")
    assert pushed.keys() == start.keys() and all(pushed[k].dtype == start[k].dtype for k in start)
    moved = sum(int((pushed[k] != start[k]).sum()) for k in start)
    total = sum(t.numel() for t in start.values())
    print(f"weights that changed in bfloat16 after one step: {moved} of {total}")
    assert moved > 0


def test_serve_model_refuses_what_it_cannot_do_safely(tmp_path: Path) -> None:
    """``trainer-client serve-model`` (``make model-server``): no vLLM environment is an error
    that says how to make one; the weight-sync endpoints (which read any path) only on loopback."""
    done = cli("serve-model", "--python", str(tmp_path / "none" / "bin" / "python"), timeout_s=300)
    assert done.returncode == 2 and "make vllm" in done.stderr, done.stderr
    done = cli("serve-model", "--weight-sync", "--host", "0.0.0.0", timeout_s=300)
    assert done.returncode == 2 and "127.0.0.1 only" in done.stderr, done.stderr
