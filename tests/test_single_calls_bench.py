"""bench/peers/single_calls.py, run as a real subprocess with tiny counts against a real tool server, so
that it keeps working between the runs that give its figures: its table has a row per path, and
every answer was checked as the echo of what was sent (the counts, never the speed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import REPO

SCRIPT = REPO / "bench" / "peers" / "single_calls.py"
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"


def run_bench(*args: str, timeout_s: float = 800) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--quick", "--repeats", "1", "--callers", "4", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The first table's rows, by path name: their cells."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| (") and len(cells) == 9:
            rows[cells[0]] = cells
    return rows


def checked(stdout: str) -> int:
    match = re.search(r"answers checked: ([\d,]+), every one the echo of what was sent", stdout)
    assert match is not None, stdout
    return int(match.group(1).replace(",", ""))


@pytest.mark.timeout(900)
def test_our_paths_run_and_every_answer_is_the_echo(tmp_path: Path) -> None:
    missing = tmp_path / "no-peers" / "python"
    done = run_bench(
        "--paths", "a,b,d", "--calls", "120", "--episodes", "10", "--openenv-python", str(missing)
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    assert f"OpenEnv's python {missing} is missing: `make peers` makes it" in done.stderr
    rows = table_rows(done.stdout)
    assert set(rows) == {
        "(a) ours: POST /v1/calls, 1 call per POST",
        "(b) ours: WebSocket /v1/stream, 1 call per frame",
        "(d) ours: episode, 8 calls + release over /v1/stream",
    }, done.stdout
    for cells in rows.values():
        assert cells[1] == "4"  # callers
        assert float(cells[5].split()[0]) >= 0, "the server's CPU per call was read"
    assert "per s, ours/OpenEnv" not in done.stdout, "no ratio without OpenEnv"
    # 120 calls on (a), 120 on (b), 10 episodes of 8 calls on (d): each answer checked
    assert checked(done.stdout) == 120 + 120 + 10 * 8


@pytest.mark.timeout(900)
@pytest.mark.skipif(
    not PEERS_PYTHON.exists(), reason="OpenEnv's venv .venv-peers is missing: `make peers` makes it"
)
def test_openenv_paths_run_beside_ours() -> None:
    done = run_bench("--paths", "c,d", "--calls", "60", "--episodes", "8")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    assert "OpenEnv: openenv 0.10.0" in done.stdout
    assert set(table_rows(done.stdout)) == {
        "(c) OpenEnv echo env: WebSocket /ws step",
        "(d) ours: episode, 8 calls + release over /v1/stream",
        "(d) OpenEnv: episode, reset + 8 steps + close (new connection)",
        "(d) OpenEnv: episode, reset + 8 steps (connection kept)",
    }, done.stdout
    assert done.stdout.count("| 4 | (d) ours: episode") == 2, "ours against both OpenEnv episode rows"
    assert checked(done.stdout) == 60 + 3 * 8 * 8


def test_an_answer_that_is_not_the_echo_stops_the_bench() -> None:
    from bench.peers.single_calls import Mismatch, OpenEnv, check_results

    good = b'{"results":[{"call_id":"c1","structured":{"text":"t1"},"is_error":false}]}'
    check_results(good, "c1", "t1")
    for wrong in (
        b'{"results":[{"call_id":"c1","structured":{"text":"t2"},"is_error":false}]}',  # another text
        b'{"results":[{"call_id":"c2","structured":{"text":"t1"},"is_error":false}]}',  # another call
        b'{"results":[{"call_id":"c1","structured":null,"is_error":true}]}',  # a failure
        b'{"error":{"kind":"bad_request","message":"no"}}',
    ):
        with pytest.raises(Mismatch):
            check_results(wrong, "c1", "t1")
    step = '{"type":"observation","data":{"observation":{"echoed_message":"%s"}}}'
    OpenEnv().check_call(step % "t1", "", "t1")
    with pytest.raises(Mismatch):
        OpenEnv().check_call(step % "t2", "", "t1")
    with pytest.raises(Mismatch):
        OpenEnv().check_call('{"type":"error","data":{"message":"no"}}', "", "t1")
