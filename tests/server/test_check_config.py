"""`tool-server check-config` and `tools` agree with `serve` (issue 27, points 2 and 3): what
serve refuses, check-config refuses with the same message and exit 2; what serve lists for
toolset '*', `tools --toolset '*'` lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.server import REPO, running_server, server_config

pytestmark = pytest.mark.timeout(300)

UNANNOTATED = '''
def shout(text, times: int = 1) -> str:
    """Say it louder."""
    return text.upper() * times
'''


def environment(tmp_path: Path, tokens: str = "") -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "TOOLFACTORY_TOKENS": tokens,
    }


def run_both(config: Path, env: dict[str, str]) -> list[tuple[int | None, str]]:
    """check-config and serve on one config: (exit status, stderr) of each. A serve that
    starts (it accepted the config) is stopped and reported as None."""
    commands = (["check-config", "--config", str(config)], ["serve", "--config", str(config), "--port", "0"])
    outcomes = []
    for args in commands:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tool_server.cli", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, stderr = proc.communicate(timeout=90)
            outcomes.append((proc.returncode, stderr))
        except subprocess.TimeoutExpired:  # serving: it took the config
            proc.kill()
            _, stderr = proc.communicate()
            outcomes.append((None, stderr))
    return outcomes


CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "a token under 16 characters": ({}, "short-token", "a token must be at least 16 characters long"),
    "a tool parameter without a type": (
        {"tools": [{"target": "loud_tools:shout"}]},
        "",
        "tool loud_tools:shout: parameter 'text' of tool 'shout' has no type annotation",
    ),
    "'*' in allowed_hosts without tokens": (
        {"server": {"allowed_hosts": ["*"]}},
        "",
        'server.allowed_hosts: "*" turns the Host check off',
    ),
    "a tokens_file that is not there": (
        {"auth": {"tokens_file": "/nonexistent/tokens"}},
        "",
        "auth.tokens_file /nonexistent/tokens does not exist",
    ),
    "a session share of 0": (
        {"sessions": {"max_sessions_per_tenant": 0}},
        "",
        "sessions.max_sessions_per_tenant must be at least 1",
    ),
    "a workbench index of 10 bytes": (
        {"workbench": {"index_max_bytes": 10}},
        "",
        "workbench.index_max_bytes must be at least",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_config_refuses_what_serve_refuses(tmp_path: Path, case: str) -> None:
    overrides, tokens, message = CASES[case]
    (tmp_path / "loud_tools.py").write_text(UNANNOTATED)
    config = server_config()
    for key, value in overrides.items():
        config[key] = [*config[key], *value] if key == "tools" else value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    (checked, served) = run_both(path, environment(tmp_path, tokens))
    assert served[0] == 2 and message in served[1], served[1]  # the premise: serve refuses it
    assert checked[0] == 2 and message in checked[1], checked[1]
    assert "Traceback" not in checked[1] + served[1]


def test_check_config_accepts_what_serve_serves(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(server_config(server={"allowed_hosts": ["*"]})))
    checked = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "check-config", "--config", str(path)],
        cwd=REPO,
        env=environment(tmp_path, "a-long-enough-token-0123"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0 and checked.stdout.startswith("config OK"), checked.stderr


def test_tools_with_toolset_star_lists_what_the_server_lists(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(server_config()))

    def cli_names(toolset: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tool_server.cli", "tools", "--config", str(path), "--toolset", toolset],
            cwd=REPO,
            env=environment(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = cli_names("*")
    assert listed.returncode == 0, listed.stderr
    names = [tool["name"] for tool in json.loads(listed.stdout)]
    with running_server(path) as srv:
        served = httpx.get(srv.url + "/v1/tools", params={"toolset": "*"}, timeout=30).json()["tools"]
    assert names == [tool["name"] for tool in served]
    assert {"calculator", "echo", "sleep"} <= set(names)

    unknown = cli_names("no-such-set")
    assert unknown.returncode == 2
    assert "no toolset named 'no-such-set'; known toolsets: default, math, test, '*'" in unknown.stderr


def test_tools_piped_into_a_reader_that_leaves_prints_no_traceback(tmp_path: Path) -> None:
    """`tool-server tools | head -1`: the reader has gone when the list is written (here it
    closed its end before the command started, so every write meets a broken pipe); the
    command ends without a BrokenPipeError traceback on stderr."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(server_config()))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tool_server.cli", "tools", "--config", str(path), "--toolset", "*"],
            cwd=REPO,
            env=environment(tmp_path),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
