"""The workbench's file routes answer a refusal with the kind that says whose side it is on
(issue 27, point 8): a server without a runs directory is not a bad request."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.server import running_server, server_config

pytestmark = pytest.mark.timeout(300)


def error_of(answer: httpx.Response) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["kind"], error["message"]


def test_without_a_runs_directory_the_file_routes_say_so(tmp_path: Path) -> None:
    with running_server(server_config()) as srv:  # no workbench.runs_dir
        for path, params in (
            ("/ui/api/trajectories", {"file": "runs.jsonl"}),
            ("/ui/api/trajectory", {"file": "runs.jsonl", "line": "0"}),
            ("/ui/api/scalars", {"run": "grpo", "tag": "reward"}),
        ):
            status, kind, message = error_of(httpx.get(srv.url + path, params=params, timeout=30))
            assert (status, kind) == (404, "unavailable"), (path, message)
            assert "no runs directory" in message and "workbench.runs_dir" in message
        # An upload that is not there is still the request's fault.
        missing = httpx.get(
            srv.url + "/ui/api/trajectories", params={"file": "upload:0000/x.jsonl"}, timeout=30
        )
        assert error_of(missing)[:2] == (404, "bad_request")


def test_with_a_runs_directory_missing_and_forbidden_files_keep_their_kinds(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with running_server(server_config(workbench={"runs_dir": str(runs)})) as srv:
        url = srv.url + "/ui/api/trajectories"
        assert error_of(httpx.get(url, params={"file": "missing.jsonl"}, timeout=30))[:2] == (
            404,
            "bad_request",
        )
        outside = error_of(httpx.get(url, params={"file": "../secret.jsonl"}, timeout=30))
        assert outside[:2] == (403, "unauthorized"), outside
