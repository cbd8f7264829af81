"""Typos fail fast: one line naming the valid choices, before a model loads or a server starts.

Each used to pass silently or late: ``--verifier math_equl`` scored every trajectory 0 and exited
0; ``verl-config --format hermess`` was written into the YAML and failed inside veRL; ``--model
smolm2`` printed a traceback; ``train --engine vllm --engine-url`` of a server without weight sync
loaded the model and died at step 1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import started
from tests.support.server import running_server, server_config
from trainer_client.cli.command import main
from trainer_client.cli.preflight import check_weight_sync, unknown_choice
from trainer_client.shared import CliError

REPO = Path(__file__).resolve().parents[2]


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def verifier_server() -> Iterator[str]:
    # Five verifiers sort before math_equal: the server's hint used to list the first five.
    targets = ["code:code_tests", "match:exact_match", "match:f1", "format:format_check", "judge:judge"]
    targets += ["math:math_equal", "sql:sql_match"]
    config = server_config(verifiers=[{"target": f"tools.verifiers.{t}"} for t in targets])
    with running_server(config) as server:
        yield server.url


@pytest.fixture(scope="module")
def one_row(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    subprocess.run(
        [sys.executable, "-m", "tools.data", "build", "--out", str(out), "--tasks", "arithmetic"]
        + ["--arith-train", "2", "--arith-test", "2"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out / "arithmetic" / "test.parquet"


def test_a_verifier_typo_names_the_servers_verifiers(
    verifier_server: str, one_row: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "r.jsonl"
    code = main(
        ["rollout", "--server", verifier_server, "--data", str(one_row), "--verifier", "math_equl"]
        + ["--model", "smollm2", "--out", str(out), "--no-progress"]
    )
    assert code == 2
    assert _error_lines(capsys) == [
        "trainer-client: error: unknown verifier 'math_equl' (did you mean 'math_equal'?); "
        "choose from: code_tests, exact_match, f1, format, judge, math_equal, sql_match"
    ]
    assert not out.exists()  # nothing rolled out


def test_the_servers_hint_for_an_unknown_verifier_names_the_close_one(verifier_server: str) -> None:
    """The server's own answer (``/v1/verify``) listed the first five ``verify_*`` tools, not the close one."""
    body = {"requests": [{"verifier": "math_equl", "response": "1", "ground_truth": "1"}]}
    result = httpx.post(f"{verifier_server}/v1/verify", json=body, timeout=30).json()["results"][0]
    assert result["error"]["kind"] == "unknown_tool"
    assert "verify_math_equal" in result["error"]["message"]


def test_a_model_typo_is_one_line(one_row: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["rollout", "--server", "http://127.0.0.1:9", "--data", str(one_row), "--model", "smolm2"])
    assert code == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "unknown model 'smolm2' (did you mean 'smollm2'?)" in lines[0], lines


def test_verl_config_refuses_an_unknown_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "loop.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["verl-config", "--server", "http://127.0.0.1:8000", "--format", "hermess", "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        "argument --format: invalid choice: 'hermess'" in err and "'hermes'" in err and "'search_r1'" in err
    )
    assert not out.exists()


@pytest.fixture
def vllm_without_weight_sync(tmp_path: Path) -> Iterator[str]:
    app = tmp_path / "fake_vllm.py"
    app.write_text(
        "from starlette.applications import Starlette\n"
        "from starlette.responses import JSONResponse\n"
        "from starlette.routing import Route\n"
        "app = Starlette(routes=[Route('/v1/models', lambda r: JSONResponse({'data': []}))])\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/v1/models", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    with started(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(tmp_path), "fake_vllm:app", "--port", str(port)],
        probe=up,
        timeout_s=60,
    ):
        yield url


def test_train_refuses_a_vllm_server_without_weight_sync_before_loading_the_model(
    vllm_without_weight_sync: str, one_row: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer_client.cli.train", "train", "--server", "http://127.0.0.1:9"]
        + ["--train-data", str(one_row), "--engine", "vllm", "--engine-url", vllm_without_weight_sync],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"trainer-client train: error: the vLLM server at {vllm_without_weight_sync} cannot take the trainer's "
        "weights: start it with `trainer-client serve-model --weight-sync` (or leave out --engine-url and the "
        "trainer starts one)"
    ]


def test_weight_sync_check_explains_an_unreachable_server() -> None:
    with pytest.raises(CliError, match="cannot reach the vLLM server at http://127.0.0.1:9"):
        check_weight_sync("http://127.0.0.1:9")


def test_unknown_choice_without_a_close_one() -> None:
    assert unknown_choice("verifier", "zzz", ["f1", "exact_match"]) == (
        "unknown verifier 'zzz'; choose from: exact_match, f1"
    )
