"""Config files that extend another (``extends: builtin``): every documented way to change a
tool of the base, by its tool name or by its target, and errors that name the user's file and
line (issue 27, point 1 and the locations of point 2)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from protocol import decode_results
from tests.support.server import REPO, running_server, server_config
from tool_server.app import build_registry
from tool_server.config import ConfigError, load_config
from tool_server.registry import Registry

pytestmark = pytest.mark.timeout(300)


def extending(tmp_path: Path, text: str, base: str = "builtin") -> Path:
    path = tmp_path / f"{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(f"extends: {base}\n{text}")
    return path


def registry_of(path: Path) -> Registry:
    return build_registry(load_config(path, environ={}))


# ------------------------------------------------------------- the documented forms


def test_an_entry_drops_a_builtin_by_its_tool_name(tmp_path: Path) -> None:
    """README: `tools: [{name: sql, enabled: false}]` drops the built-in sql tool (no target)."""
    registry = registry_of(extending(tmp_path, "tools:\n  - name: sql\n    enabled: false\n"))
    assert "sql" not in registry
    assert {"calculator", "search", "python", "llm", "research"} <= set(registry.entries)


def test_an_entry_with_a_builtin_target_and_a_name_renames_it(tmp_path: Path) -> None:
    path = extending(tmp_path, "tools:\n  - target: tools.calculator:calculator\n    name: calc\n")
    registry = registry_of(path)
    assert "calc" in registry and "calculator" not in registry
    assert registry.entries["calc"].toolsets == {"default", "math"}  # the built-in's other keys stay
    assert [t.name for t in load_config(path, environ={}).tools].count("calc") == 1  # not a second entry


def test_an_entry_changes_a_builtins_args_and_limits_by_name(tmp_path: Path) -> None:
    text = "tools:\n  - name: search\n    args: {topk: 7}\n  - name: calculator\n    timeout_s: 3\n"
    registry = registry_of(extending(tmp_path, text))
    assert registry.entries["search"].instance.topk == 7
    assert registry.entries["calculator"].meta.timeout_s == 3
    assert registry.entries["search"].toolsets == {"default", "search"}


def test_an_entry_changes_a_builtin_by_target_and_a_verifier_by_name(tmp_path: Path) -> None:
    text = (
        "tools:\n  - target: tools.sql:SqlTool\n    enabled: false\n"
        "verifiers:\n  - name: judge\n    enabled: false\n"
    )
    registry = registry_of(extending(tmp_path, text))
    assert "sql" not in registry and "verify_judge" not in registry
    assert "verify_exact_match" in registry


def test_a_second_entry_with_a_builtin_target_is_a_second_tool(tmp_path: Path) -> None:
    """The way to serve a built-in target twice: name the built-in, then add the other."""
    text = (
        "tools:\n  - name: search\n"
        "  - target: tools.search:SearchTool\n    name: wiki\n    args: {topk: 1}\n    toolsets: [wiki]\n"
    )
    registry = registry_of(extending(tmp_path, text))
    assert registry.entries["search"].instance.topk == 3 and registry.entries["wiki"].instance.topk == 1
    assert registry.toolsets["wiki"] == {"wiki"}


def test_a_base_serving_one_target_twice_needs_a_name_to_say_which(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {"target": "tools.testing:echo", "name": "first"},
                    {"target": "tools.testing:echo", "name": "second"},
                ]
            }
        )
    )
    ambiguous = extending(
        tmp_path, "tools:\n  - target: tools.testing:echo\n    enabled: false\n", "base.yaml"
    )
    with pytest.raises(
        ConfigError, match=r"serves tools.testing:echo 2 times \('first', 'second'\); add name:"
    ):
        load_config(ambiguous, environ={})
    by_name = extending(tmp_path, "tools:\n  - name: second\n    enabled: false\n", "base.yaml")
    assert set(registry_of(by_name).entries) == {"first"}


def test_the_documented_forms_on_a_served_server(tmp_path: Path) -> None:
    """A base without names (as the built-in file), a child changing it by tool name: what the
    server then serves and calls."""
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(server_config()))
    child = extending(
        tmp_path,
        "tools:\n"
        "  - name: echo\n    enabled: false\n"
        "  - target: tools.calculator:calculator\n    name: calc\n"
        "  - name: count\n    timeout_s: 5\n",
        "base.yaml",
    )
    with running_server(child) as srv:
        tools = {t["name"]: t for t in httpx.get(srv.url + "/v1/tools?toolset=*", timeout=30).json()["tools"]}
        assert "echo" not in tools and "calculator" not in tools
        assert tools["count"]["_meta"]["toolfactory"]["timeout_s"] == 5
        call = {"call_id": uuid.uuid4().hex, "name": "calc", "arguments": {"expression": "6*7"}}
        answer = httpx.post(srv.url + "/v1/calls", json={"calls": [call]}, timeout=30)
        (result,) = decode_results(answer.content)
        assert result.structured["result"] == 42


# ------------------------------------------------------------- mistakes, and where they are


def test_an_entry_that_changes_nothing_is_refused_with_the_names_it_could_change(tmp_path: Path) -> None:
    typo = extending(tmp_path, "tools:\n  - name: sqll\n    enabled: false\n")
    with pytest.raises(ConfigError) as caught:
        load_config(typo, environ={})
    message = str(caught.value)
    assert message.startswith(f"{typo}:3: ")  # the user's file and line
    assert "no tool named 'sqll'" in message and "calculator" in message and "sql" in message
    wrong_target = extending(tmp_path, "tools:\n  - target: tools.sql:SqlToo\n    enabled: false\n")
    with pytest.raises(ConfigError, match="no tool with target tools.sql:SqlToo"):
        load_config(wrong_target, environ={})


def test_a_tool_without_target_in_a_plain_file_is_a_configuration_error(tmp_path: Path) -> None:
    """Exit 2 with the file and line, not a TypeError traceback (exit 1)."""
    path = tmp_path / "plain.yaml"
    path.write_text("server:\n  port: 8000\ntools:\n  - target: tools.testing:echo\n  - name: sql\n")
    checked = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "check-config", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 2, checked.stderr
    assert f"{path}:5: tools: missing key(s) ['target']" in checked.stderr
    assert "Traceback" not in checked.stderr


def test_errors_in_an_entry_name_the_users_file_and_line_not_the_merged_index(tmp_path: Path) -> None:
    added = extending(tmp_path, "tools:\n  - target: tools.testing:echo\n    toolset: [mine]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(added, environ={})
    assert str(caught.value).startswith(f"{added}:3: tools: unknown key(s) ['toolset']")
    assert "tools[" not in str(caught.value)  # the merged list's index names nothing the user wrote
    changed = extending(
        tmp_path, "server:\n  port: 8000\ntools:\n  - name: calculator\n    timeout_s: soon\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(changed, environ={})
    assert str(caught.value).startswith(f"{changed}:5: tools.timeout_s: expected float")


# ------------------------------------------------------------- toolsets not given


def test_a_tool_without_toolsets_is_in_the_default_toolset(tmp_path: Path) -> None:
    config = server_config()
    config["tools"] = [
        *config["tools"],
        {"target": "tools.testing:echo", "name": "plain"},
        {"target": "tools.testing:echo", "name": "hidden", "toolsets": []},
    ]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    by_name = {t.name: t for t in load_config(path, environ={}).tools if t.name}
    assert by_name["plain"].toolsets == ["default"] and by_name["hidden"].toolsets == []
    with running_server(path) as srv:
        listed = [t["name"] for t in httpx.get(srv.url + "/v1/tools", timeout=30).json()["tools"]]
        assert "plain" in listed and "hidden" not in listed
        every = [t["name"] for t in httpx.get(srv.url + "/v1/tools?toolset=*", timeout=30).json()["tools"]]
        assert "hidden" in every
    # Without a default toolset (/mcp and /v1/tools list every tool) it is in none.
    path.write_text(yaml.safe_dump({**config, "default_toolset": None}))
    by_name = {t.name: t for t in load_config(path, environ={}).tools if t.name}
    assert by_name["plain"].toolsets == []
