"""Configuring upstreams: the MCP clients' config shapes, check-config and tools agreeing
with serve, OpenAI-safe names, and the documented keys."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from protocol import META_KEY
from tests.server.upstream.test_served import wait_for
from tests.support.require import require_program
from tests.support.server import BASE_TOOLS, REPO, running_server, server_config
from tool_server.config import DEFAULT_CONFIG_PATH, Config
from tool_server.upstream.hosting import CLIENT_ONLY_KEYS, MAX_NAME_LENGTH, OPTION_KEYS, export_names

TIME_SERVER = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
require_program(TIME_SERVER, "mcp-server-time (dev extra)")
pytestmark = [
    pytest.mark.timeout(180),
]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tool_server.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write(path: Path, config: dict[str, Any]) -> str:
    path.write_text(json.dumps(config))  # JSON, as pasted from a client's config file (YAML reads it)
    return str(path)


# --------------------------------------------------------------- client shapes


def test_pasted_client_configs_are_served(tmp_path: Path) -> None:
    config = server_config(
        mcpServers={  # Cline / Roo Code
            "cline": {
                "command": TIME_SERVER,
                "args": ["--local-timezone", "UTC"],
                "autoApprove": ["get_current_time"],
                "alwaysAllow": [],
                "disabled": False,
                "timeout": 7,
                "transportType": "stdio",
            },
            "off": {"command": "/nonexistent/server", "disabled": True},
        },
        servers={  # VS Code: servers + type, ${env:NAME}
            "vscode": {
                "type": "stdio",
                "command": TIME_SERVER,
                "env": {"HOME": "${env:HOME}"},
                "disabledTools": ["convert_time"],
                "dev": {"watch": "src/**"},
            }
        },
    )
    path = write(tmp_path / "mcp.json", config)
    checked = cli("check-config", "--config", path)
    assert checked.returncode == 0, checked.stderr
    with running_server(path) as srv:
        ready = lambda: httpx.get(srv.url + "/readyz").json()["checks"]["upstreams"]["ready"]  # noqa: E731
        wait_for(lambda: ready() == ["cline", "vscode"])
        tools = {t["name"]: t for t in httpx.get(srv.url + "/v1/tools").json()["tools"]}
        assert {"cline__get_current_time", "cline__convert_time", "vscode__get_current_time"} <= set(tools)
        assert "vscode__convert_time" not in tools  # disabledTools is honoured
        assert not any(name.startswith("off__") for name in tools)
        assert tools["cline__get_current_time"]["_meta"][META_KEY]["timeout_s"] == 7.0  # Cline's timeout
        warnings = [line for line in srv.output.splitlines() if "only mean something to MCP clients" in line]
        assert len(warnings) == 1, srv.output
        assert "cline.alwaysAllow, cline.autoApprove, vscode.dev" in warnings[0]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"command": TIME_SERVER, "autoApprov": []}, "mcpServers.time has unknown keys ['autoApprov']"),
        (
            {"command": TIME_SERVER, "args": ["--local-timezone", "${NO_SUCH_VARIABLE_XYZ}"]},
            "mcpServers.time.args refers to ${NO_SUCH_VARIABLE_XYZ}, but the environment variable "
            "NO_SUCH_VARIABLE_XYZ is not set",
        ),
        ({"command": TIME_SERVER, "env": {"KEY": "${input:api-key}"}}, "VS Code input variable"),
        ({"url": "http://127.0.0.1:9/mcp", "per_session": True}, "per_session needs a stdio server"),
    ],
)
def test_check_config_refuses_what_serve_refuses(tmp_path: Path, entry: dict[str, Any], message: str) -> None:
    path = write(tmp_path / "bad.json", server_config(mcpServers={"time": entry}))
    commands = (["check-config", "--config", path], ["serve", "--config", path, "--port", "0"])
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "tool_server.cli", *args], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for args in commands
    ]
    for proc in running:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2 and message in stderr, stderr


def test_check_config_probe_lists_upstream_tools_and_name_clashes(tmp_path: Path) -> None:
    good = write(tmp_path / "good.json", server_config(mcpServers={"time": {"command": TIME_SERVER}}))
    checked = cli("check-config", "--config", good)
    assert checked.returncode == 0 and "not started" in checked.stdout and "--probe" in checked.stdout
    probed = cli("check-config", "--config", good, "--probe")
    assert probed.returncode == 0, probed.stdout + probed.stderr
    assert (
        "upstream time: ready (2026-07-28), 2 tools: time__get_current_time, time__convert_time"
        in probed.stdout
    )

    clashing = server_config(
        tools=[*BASE_TOOLS, {"target": "tools.testing:echo", "name": "time__convert_time"}],
        mcpServers={
            "time": {"command": TIME_SERVER},
            "time2": {"command": TIME_SERVER, "namespace": "time"},
            "ghost": {"command": "/nonexistent/mcp-server", "connect_timeout_s": 2},
        },
    )
    probed = cli("check-config", "--config", write(tmp_path / "clash.json", clashing), "--probe")
    assert probed.returncode == 1
    lines = probed.stdout.splitlines()
    assert (
        "PROBLEM upstream time: 'time__convert_time' (tool 'convert_time') clashes with the configured tool "
        "of that name; not exposed: give mcpServers.time a namespace, or the tool another name"
    ) in lines
    assert (
        "PROBLEM upstream time2: 'time__get_current_time' (tool 'get_current_time') clashes with the same "
        "name from upstream 'time', listed earlier in mcpServers; not exposed: give mcpServers.time2 "
        "another namespace"
    ) in lines
    assert any(line.startswith("PROBLEM upstream ghost: ") and "not found" in line for line in lines)


def test_tools_command_lists_upstream_tools_or_says_it_leaves_them_out(tmp_path: Path) -> None:
    path = write(tmp_path / "c.json", server_config(mcpServers={"time": {"command": TIME_SERVER}}))
    plain = cli("tools", "--config", path)
    assert plain.returncode == 0
    assert "time__get_current_time" not in plain.stdout
    assert "1 upstream MCP server(s) configured (time)" in plain.stderr and "left out" in plain.stderr
    probed = cli("tools", "--config", path, "--probe", "--toolset", "upstream:time")
    assert probed.returncode == 0, probed.stderr
    names = [tool["name"] for tool in json.loads(probed.stdout)]
    assert names == ["time__get_current_time", "time__convert_time"]


# ------------------------------------------------------------------------ names


def test_exported_names_follow_openai_rules_without_collisions() -> None:
    names = export_names("web__", ["get weather!", "get_weather_", "search.v2", "x" * 80, "x" * 81])
    assert names["get_weather_"] == "web__get_weather_"  # the real name keeps its name...
    assert names["get weather!"].startswith("web__get_weather__")  # ...the sanitised one gets a digest
    assert names["search.v2"] == "web__search_v2"
    assert len(set(names.values())) == len(names)
    assert all(OPENAI_NAME.match(name) and len(name) <= MAX_NAME_LENGTH for name in names.values())
    # Independent of the order the upstream lists them in.
    assert export_names("web__", ["get_weather_", "get weather!"]) == export_names(
        "web__", ["get weather!", "get_weather_"]
    )
    assert Config().upstream_separator == "__"


# ---------------------------------------------------------------------- documented


def test_every_upstream_key_is_documented_in_the_default_config() -> None:
    text = DEFAULT_CONFIG_PATH.read_text()
    documented = yaml.safe_load(text)
    assert "upstream_separator" in documented and "servers" in documented and "mcpServers" in documented
    honoured = {"command", "args", "env", "envFile", "cwd", "url", "headers", "type", "transportType"}
    honoured |= {"timeout", "disabled", "disabledTools"}
    for key in sorted(OPTION_KEYS | CLIENT_ONLY_KEYS | honoured):
        assert re.search(rf"\b{key}\b", text), f"{key} is not documented in default.yaml"
    for toolset in ("upstream", "upstream:<name>"):
        assert toolset in text
