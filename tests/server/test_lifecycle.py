"""Graceful shutdown, config inheritance and the container files."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from protocol import decode_results
from tests.support.server import REPO, running_server, server_config
from tool_server.config import ConfigError, load_config


def test_sigterm_lets_in_flight_calls_finish():
    with running_server(server_config(server={"shutdown_grace_s": 10})) as srv:
        outcome: dict = {}

        def slow_call() -> None:
            body = {"calls": [{"call_id": uuid.uuid4().hex, "name": "sleep", "arguments": {"seconds": 1.5}}]}
            outcome["response"] = httpx.post(srv.url + "/v1/calls", json=body, timeout=30)

        worker = threading.Thread(target=slow_call)
        worker.start()
        time.sleep(0.5)
        srv.proc.send_signal(signal.SIGTERM)
        worker.join(30)
        assert srv.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean stop
        response = outcome["response"]
        assert response.status_code == 200
        assert decode_results(response.content)[0].structured == {"slept": 1.5}


def test_extends_builtin_merges_and_overrides(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("extends: builtin\nlimits:\n  max_concurrency: 3\n")
    config = load_config(child, environ={})
    builtin = load_config(None, environ={})
    assert config.limits.max_concurrency == 3
    assert config.limits.max_queue == builtin.limits.max_queue
    assert [t.target for t in config.tools] == [t.target for t in builtin.tools]


def test_container_config_loads():
    config = load_config(REPO / "compose" / "config.yaml", environ={})
    assert config.server.host == "0.0.0.0"
    assert config.server.shutdown_grace_s < 30


def test_compose_file_and_dockerfile_are_consistent():
    compose = yaml.safe_load((REPO / "compose" / "docker-compose.yml").read_text())
    service = compose["services"]["tool-server"]
    assert service["build"]["dockerfile"] == "compose/Dockerfile"
    assert any(v.endswith(":/config/config.yaml:ro") for v in service["volumes"])
    assert "TOOLFACTORY_TOKENS" in service["environment"]
    dockerfile = (REPO / "compose" / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "/healthz" in dockerfile
    assert "USER toolfactory" in dockerfile
    assert '"tool-server", "serve", "--config", "/config/config.yaml"' in dockerfile
    for copied in ("protocol", "tool_server", "tools"):
        assert (REPO / copied).is_dir()


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _compose_available(), reason="the docker compose plugin is not installed on this machine"
)
def test_docker_compose_config_validates():
    proc = subprocess.run(
        ["docker", "compose", "-f", str(Path("compose") / "docker-compose.yml"), "config", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"TOOLFACTORY_TOKENS": "x" * 20, "PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    assert proc.returncode == 0, proc.stderr


def test_every_config_key_is_in_the_documented_default_file():
    import dataclasses

    import yaml

    from tool_server.config import DEFAULT_CONFIG_PATH, Config

    documented = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    missing = [
        f"{section.name}.{key.name}"
        for section in dataclasses.fields(Config)
        if dataclasses.is_dataclass(section.default_factory)
        for key in dataclasses.fields(section.default_factory)
        if key.name not in (documented.get(section.name) or {})
    ]
    assert missing == []


def test_gc_tuning_raises_the_young_threshold_and_zero_keeps_it():
    import gc

    from tool_server.cli import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc(0)
        assert gc.get_threshold() == before
        tune_gc(50_000)
        assert gc.get_threshold() == (50_000, before[1], before[2])
        assert gc.get_freeze_count() > 0  # startup objects are out of later collections
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_extends_adds_tools_and_replace_takes_only_the_files_list(tmp_path):
    builtin = [t.target for t in load_config(None, environ={}).tools]
    added = tmp_path / "added.yaml"
    added.write_text(
        "extends: builtin\n"
        "tools:\n"
        "  - target: tools.testing:echo\n"
        "    toolsets: [mine]\n"
        "  - target: tools.sql:SqlTool\n"
        "    enabled: false\n"
        "  - target: tools.calculator:calculator\n"
        "    timeout_s: 3\n"
    )
    config = load_config(added, environ={})
    targets = [t.target for t in config.tools]
    assert targets == [*builtin, "tools.testing:echo"]  # added, in place
    by_target = {t.target: t for t in config.tools}
    assert by_target["tools.sql:SqlTool"].enabled is False  # dropped by the override
    assert by_target["tools.calculator:calculator"].timeout_s == 3
    assert by_target["tools.calculator:calculator"].toolsets == ["default", "math"]  # the rest kept

    replaced = tmp_path / "replaced.yaml"
    replaced.write_text("extends: builtin\nreplace: [tools]\ntools:\n  - target: tools.testing:echo\n")
    config = load_config(replaced, environ={})
    assert [t.target for t in config.tools] == ["tools.testing:echo"]
    assert config.verifiers  # verifiers were not named in replace: still the built-in ones

    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: builtin\nreplace: [limits]\n")
    with pytest.raises(ConfigError, match="replace must be a list"):
        load_config(bad, environ={})
