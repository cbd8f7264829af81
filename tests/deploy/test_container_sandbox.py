"""The documented container gets the strong sandbox, and a server without it says so (issue 30, point 14).

tests/deploy/test_image.py runs the image under the compose file in a real engine. Here the
deployment files are read as data (compose and Kubernetes must grant the same), and what they
grant is reproduced on a real ``tool-server serve`` without an engine: a root process limited by ``setpriv`` to exactly
the capabilities the files add (bounding set, no_new_privs) must get the strong sandbox; an
unprivileged one (the image's own user, as a plain ``docker run`` starts it) gets the weak
fallback, and then ``serve`` refuses to expose python beyond loopback unless
``server.allow_weak_sandbox`` says so. The seccomp and AppArmor settings cannot be
reproduced without an engine: they are checked as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import RunningProcess, started
from tests.support.server import REPO
from tool_server.config import load_config

COMPOSE = REPO / "compose" / "docker-compose.yml"
K8S = REPO / "compose" / "k8s"
TOKEN = "container-sandbox-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM_PYTHON = "/usr/bin/python3"  # world-readable, like the image's /usr/local/bin/python
NOBODY = "65534"
CONFIG = {
    "tools": [
        {"target": "tools.calculator:calculator", "toolsets": ["default"]},
        {"target": "tools.python_tool:PythonTool", "toolsets": ["default"], "args": {"pool_size": 1}},
    ],
    "server": {"shutdown_grace_s": 2},
    "workbench": {"enabled": False},
}


def compose_service() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]["tool-server"]


def k8s_container() -> dict[str, Any]:
    (deployment,) = [d for d in yaml.safe_load_all((K8S / "deployment.yaml").read_text()) if d]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def granted() -> list[str]:
    """The capabilities compose adds (the test below checks Kubernetes adds the same)."""
    return sorted(compose_service()["cap_add"])


def test_compose_grants_what_the_strong_sandbox_takes_and_nothing_more() -> None:
    service = compose_service()
    assert str(service["user"]).split(":")[0] == "0"  # root in the container: it drops each worker's uid
    assert service["cap_drop"] == ["ALL"]
    assert "SYS_ADMIN" in service["cap_add"] and not service.get("privileged", False)
    options = service["security_opt"]
    assert "apparmor=unconfined" in options  # docker-default denies mount
    assert not any(o.replace(":", "=").startswith("seccomp=") for o in options)  # the default profile stays
    assert "no-new-privileges:true" in options
    assert service["init"] is True  # reaps what killed sandboxes leave
    # Replicas on one host share its uids: each claims its own slice in a shared directory.
    env = service["environment"]
    claims = env["TOOLFACTORY__SANDBOX__CLAIMS_DIR"]
    assert env["TOOLFACTORY__SANDBOX__REPLICA_INDEX"] == "" and int(env["TOOLFACTORY__SANDBOX__REPLICAS"]) > 1
    assert any(v.split(":")[1] == claims for v in service["volumes"])
    config = load_config(REPO / "compose" / "config.yaml", environ={})
    assert config.server.host == "0.0.0.0" and not config.server.allow_weak_sandbox
    if (
        subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):  # pragma: no cover
        checked = subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
            env={**os.environ, "TOOLFACTORY_TOKENS": TOKEN},
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0, checked.stderr


def seconds(duration: str) -> float:
    """A compose duration such as ``30s`` or ``1m30s``."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", str(duration))
    assert parts and any(parts.groups()), f"not a duration compose and podman-compose both read: {duration}"
    return sum(int(n) * units[u] for n, u in zip(parts.groups(), "hms", strict=True) if n)


def test_compose_publishes_on_loopback_and_stops_after_the_drain() -> None:
    """Published on 127.0.0.1 unless TOOLFACTORY_PUBLISH_IP says otherwise; replicas podman-compose
    starts too (it reads deploy.replicas only with mode: replicated); a stop that waits longer
    than the server drains (podman-compose stop/down and docker compose pass stop_grace_period)."""
    service = compose_service()
    (port,) = service["ports"]
    assert port == "${TOOLFACTORY_PUBLISH_IP:-127.0.0.1}::8000", port  # a free host port per replica
    assert service["deploy"]["mode"] == "replicated" and service["deploy"]["replicas"] >= 2
    config = load_config(REPO / "compose" / "config.yaml", environ={})
    assert seconds(service["stop_grace_period"]) > config.server.shutdown_grace_s
    assert service["build"]["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"


def test_kubernetes_grants_the_same_as_compose() -> None:
    container = k8s_container()
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and security["privileged"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert sorted(security["capabilities"]["add"]) == granted()
    assert security["appArmorProfile"]["type"] == "Unconfined"
    (deployment,) = [d for d in yaml.safe_load_all((K8S / "deployment.yaml").read_text()) if d]
    assert (
        deployment["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"]
        == "RuntimeDefault"
    )
    (configmap,) = [d for d in yaml.safe_load_all((K8S / "configmap.yaml").read_text()) if d]
    assert not yaml.safe_load(configmap["data"]["config.yaml"])["server"]["allow_weak_sandbox"]


@pytest.fixture
def config_path() -> Iterator[Path]:
    """The config in a directory every user can read (the unprivileged server reads it too)."""
    folder = Path(tempfile.mkdtemp(prefix="container-sandbox-"))
    try:
        folder.chmod(0o755)
        path = folder / "config.yaml"
        path.write_text(yaml.safe_dump(CONFIG))
        path.chmod(0o644)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def needs_setpriv() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a server with a given set of capabilities")


def serve(python: str, config: Path, host: str) -> list[str]:
    return [python, "-m", "tool_server.cli", "serve", "--config", str(config), "--host", host, "--port", "0"]


def sandbox_of(process: RunningProcess) -> dict[str, Any]:
    """/readyz's sandbox field (a token for every tool sees it; an anonymous probe does not)."""
    assert process.match is not None
    url = process.match.group(1).replace("0.0.0.0", "127.0.0.1")
    public = httpx.get(url + "/readyz", timeout=30).json()
    assert "sandbox" not in public
    return httpx.get(url + "/readyz", headers=AUTH, timeout=30).json()["sandbox"]


def test_exactly_the_granted_capabilities_give_the_strong_sandbox(config_path: Path) -> None:
    needs_setpriv()
    caps = ",".join(["-all", *(f"+{c.lower()}" for c in granted())])
    limited = ["setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set={caps}"]
    with started(
        limited + serve(sys.executable, config_path, "0.0.0.0"),
        ready_line=r"Uvicorn running on (http://\S+)",
        cwd=REPO,
        env={"TOOLFACTORY_TOKENS": TOKEN},
    ) as server:
        sandbox = sandbox_of(server)
        assert sandbox["mode"] == "strong", (sandbox, server.output)
        assert sandbox["tools"] == ["python"]
        assert "sandbox: strong" in server.output


def unprivileged(python: str) -> tuple[list[str], dict[str, str]]:
    """Run as an unprivileged user (the image's own, as `docker run` starts it): the command
    prefix and environment, or skip where the system Python cannot load our dependencies."""
    needs_setpriv()
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs {SYSTEM_PYTHON}")
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]
    env = {
        "PYTHONPATH": f"{REPO}:{sysconfig.get_paths()['purelib']}",
        "HOME": tempfile.gettempdir(),
        "TOOLFACTORY_TOKENS": TOKEN,
    }
    probe = subprocess.run(
        [*prefix, python, "-c", "import tool_server.cli, uvicorn, orjson"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"{SYSTEM_PYTHON} cannot load the server's dependencies: {probe.stderr[-300:]}")
    return prefix, env


def test_without_them_serve_refuses_python_beyond_loopback_unless_configured(config_path: Path) -> None:
    prefix, env = unprivileged(SYSTEM_PYTHON)
    command = prefix + serve(SYSTEM_PYTHON, config_path, "0.0.0.0")
    try:
        refused = subprocess.run(
            command, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"serve kept running with the weak sandbox on 0.0.0.0 instead of refusing: {exc.stderr!r}"
        )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = refused.stderr
    assert "refusing to serve python" in message and "weak sandbox" in message
    assert "server.allow_weak_sandbox" in message and "CAP_SYS_ADMIN" in message
    allowed = {**env, "TOOLFACTORY__SERVER__ALLOW_WEAK_SANDBOX": "true"}
    with started(command, ready_line=r"Uvicorn running on (http://\S+)", cwd=REPO, env=allowed) as server:
        sandbox = sandbox_of(server)
        assert sandbox["mode"] == "weak", (sandbox, server.output)
        assert any("mount namespace" in part for part in sandbox["missing"])
        assert "sandbox: WEAK" in server.output
    # On loopback only this machine reaches it: served, with the same warning.
    local = prefix + serve(SYSTEM_PYTHON, config_path, "127.0.0.1")
    with started(local, ready_line=r"Uvicorn running on (http://\S+)", cwd=REPO, env=env) as server:
        assert sandbox_of(server)["mode"] == "weak"
