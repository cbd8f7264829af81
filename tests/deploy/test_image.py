"""The tool server's image, built and run as users run it (issue 38): not a file, a tested product.

The image is built as ``make image`` builds it (compose/image.sh: docker or podman, layers
reused, a base from Debian's archive where no registry answers). Run plainly it is
unprivileged, and ``serve`` refuses python on 0.0.0.0. compose/docker-compose.yml is then run
as written by the compose tool of that engine (``docker compose`` or ``podman-compose``):
two replicas on one claims volume, each published on a loopback port, with exactly the
capabilities the file grants. Through those ports: the strong sandbox, calls with a token
and 401 without, disjoint uid slices, a healthy HEALTHCHECK; and a ``compose stop`` while
calls run (POST and /v1/stream) loses none of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import yaml
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.support.containers import COMPOSE_FILE, build_image, capability_names, compose_command, engine
from tests.support.server import REPO

# A cold build bootstraps the base from Debian's archive first (a few minutes, once). Under
# pytest-xdist (--dist loadgroup) one worker runs them all: one build, one compose stack.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.xdist_group("container-image")]

TOKEN = "image-test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 180
SLEEP_S = 5  # each in-flight call of the drain test; the server drains for 25 s (compose/config.yaml)


def compose_service() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]["tool-server"]


@pytest.fixture(scope="module")
def engine_name() -> str:
    return engine()


@pytest.fixture(scope="module")
def image(engine_name: str) -> str:
    return build_image()


def test_a_plain_run_is_unprivileged_and_refuses_python_on_every_interface(
    engine_name: str, image: str
) -> None:
    """`docker run IMAGE` as documented: its own user, no capabilities, the weak sandbox only;
    compose/config.yaml binds 0.0.0.0, so serve exits 2 saying what to grant."""
    ran = subprocess.run(
        [engine_name, "run", "--rm", "-e", f"TOOLFACTORY_TOKENS={TOKEN}", image],
        capture_output=True,
        text=True,
        timeout=300,
    )
    message = ran.stdout + ran.stderr
    assert ran.returncode == 2, message
    assert "refusing to serve python" in message and "weak sandbox" in message
    assert "server.allow_weak_sandbox" in message and "CAP_SYS_ADMIN" in message


@dataclass
class Stack:
    """compose/docker-compose.yml running as project ``project``: its replicas by container name."""

    engine: str
    compose: list[str]
    env: dict[str, str]
    urls: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [self.engine, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"{self.engine} {' '.join(args)}: {done.stderr}"
        return done.stdout

    def logs(self, name: str) -> str:
        done = subprocess.run([self.engine, "logs", name], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    def state(self, name: str, what: str) -> str:
        return self.run("inspect", "--format", "{{.State." + what + "}}", name).strip()


def containers_of(engine_name: str, project: str) -> list[str]:
    listed = subprocess.run(
        [engine_name, "ps", "-a", "--filter", f"label=com.docker.compose.project={project}"]
        + ["--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return sorted(listed.stdout.split())


def wait_ready(stack: Stack, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if stack.state(name, "Running") != "true":
            pytest.fail(f"{name} stopped while starting:\n{stack.logs(name)[-4000:]}", pytrace=False)
        try:
            if httpx.get(stack.urls[name] + "/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"{name} not ready in {START_TIMEOUT_S} s:\n{stack.logs(name)[-4000:]}", pytrace=False
            )
        time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(engine_name: str, image: str) -> Iterator[Stack]:
    """`compose up -d` as the file's header says, with a token; `compose down -v` afterwards."""
    project = f"toolfactory-test-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "TOOLFACTORY_PUBLISH_IP"}  # the default: loopback
    env["TOOLFACTORY_TOKENS"] = TOKEN
    running = Stack(engine_name, compose_command(engine_name, project), env)

    def compose(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*running.compose, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
        )

    try:
        up = compose("up", "-d")
        assert up.returncode == 0, up.stdout + up.stderr
        names = containers_of(engine_name, project)
        assert len(names) == compose_service()["deploy"]["replicas"], (names, up.stderr)
        for name in names:
            published = running.run("port", name, "8000").split()[0]
            running.urls[name] = f"http://{published}"
        for name in names:
            wait_ready(running, name)
        yield running
    finally:
        compose("down", "-v")


def test_each_replica_is_published_on_loopback_only(stack: Stack) -> None:
    for url in stack.urls.values():
        assert urlsplit(url).hostname == "127.0.0.1", url


SERVER_STATUS = """
import json, pathlib
pids = sorted(int(p.name) for p in pathlib.Path("/proc").iterdir() if p.name.isdigit())
for pid in pids:
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        continue
    if any(part.endswith(b"tool-server") for part in cmdline) and b"serve" in cmdline:
        fields = dict(line.split(":", 1) for line in status.splitlines())
        print(json.dumps({k: fields[k].strip() for k in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp")}))
        break
"""


def test_with_compose_s_capabilities_exactly_the_sandbox_is_strong(stack: Stack) -> None:
    granted = sorted(compose_service()["cap_add"])
    for name, url in stack.urls.items():
        sandbox = httpx.get(url + "/readyz", headers=AUTH, timeout=30).json()["sandbox"]
        assert sandbox["mode"] == "strong", (name, sandbox)
        assert "python" in sandbox["tools"]
        server = json.loads(stack.run("exec", name, "python", "-c", SERVER_STATUS))
        assert capability_names(server["CapEff"]) == granted, (name, server)
        assert capability_names(server["CapBnd"]) == granted, (name, server)
        assert server["NoNewPrivs"] == "1" and server["Seccomp"] == "2", (name, server)  # filter mode


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}


def run_calls(url: str, *calls: dict[str, Any]) -> list[dict[str, Any]]:
    answer = httpx.post(url + "/v1/calls", json={"calls": list(calls)}, headers=AUTH, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["results"]


def uid_slice(stack: Stack, name: str) -> range:
    """The slice the replica's running server claimed: its log's last claim. A replica that
    compose restarted (``restart: unless-stopped``, seen once in a loaded full run) logged one
    per start, and released the earlier claim with its process."""
    logs = stack.logs(name)
    found = re.findall(r"sandbox uids (\d+)-(\d+)", logs)
    assert found, f"{name} logged no uid slice:\n{logs[-3000:]}"
    if len(found) > 1:
        restarts = stack.run("inspect", "--format", "{{.RestartCount}}", name).strip()
        print(f"{name} started {len(found)} times (restarts: {restarts}):\n{logs[-3000:]}")
    first, last = found[-1]
    return range(int(first), int(last) + 1)


def test_calls_through_the_published_port_need_the_token(stack: Stack) -> None:
    for name, url in stack.urls.items():
        body = {"calls": [call("calculator", expression="6*7")]}
        assert httpx.post(url + "/v1/calls", json=body, timeout=30).status_code == 401
        assert httpx.get(url + "/v1/tools", timeout=30).status_code == 401
        assert httpx.get(url + "/readyz", timeout=30).status_code == 200  # the probes stay public
        sum_, uid = run_calls(
            url, call("calculator", expression="6*7"), call("python", code="import os\nos.getuid()")
        )
        assert not sum_["is_error"] and sum_["structured"]["result"] == 42, sum_
        assert not uid["is_error"], uid
        # A worker runs as a uid of its own, from this replica's slice: never root.
        assert int(uid["structured"]["value"]) in uid_slice(stack, name), (name, uid)


def test_replicas_on_one_claims_volume_take_disjoint_uid_slices(stack: Stack) -> None:
    slices = [uid_slice(stack, name) for name in stack.urls]
    assert len(slices) == 2
    first, second = slices
    assert not set(first) & set(second), slices


def test_the_healthcheck_turns_healthy(stack: Stack) -> None:
    """Docker runs the image's HEALTHCHECK itself; podman without systemd runs it when asked."""
    for name in stack.urls:
        deadline = time.monotonic() + START_TIMEOUT_S
        while (status := stack.state(name, "Health.Status")) != "healthy":
            assert status in ("starting", ""), (name, status, stack.logs(name)[-2000:])
            assert time.monotonic() < deadline, f"{name}: health {status!r}"
            if stack.engine == "podman":
                subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, timeout=60)
            time.sleep(1)


@dataclass
class Drained:
    """What the drain test saw: the answers to calls in flight when `compose stop` began."""

    posts: list[Any]
    stream: dict[str, dict[str, Any]]
    stream_closed: str | None
    stop: subprocess.CompletedProcess[str]
    exit_code: int


async def calls_through_a_stop(stack: Stack) -> Drained:
    name, url = next(iter(stack.urls.items()))
    sleepy = f"import time\ntime.sleep({SLEEP_S})\n'done'"
    stream_calls = [call("python", code=sleepy) for _ in range(2)]
    async with (
        httpx.AsyncClient(headers=AUTH, timeout=120) as client,
        connect(url.replace("http", "ws", 1) + "/v1/stream", additional_headers=AUTH) as ws,
    ):
        await ws.send(orjson.dumps({"calls": stream_calls}))
        posts = [
            asyncio.create_task(client.post(url + "/v1/calls", json={"calls": [call("python", code=sleepy)]}))
            for _ in range(2)
        ]
        deadline = time.monotonic() + 60
        while (await client.get(url + "/readyz")).json()["in_flight"] < 4:
            assert time.monotonic() < deadline, "the calls never ran"
            await asyncio.sleep(0.05)
        stop = asyncio.create_task(
            asyncio.to_thread(
                subprocess.run,
                [*stack.compose, "stop"],
                env=stack.env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
        )
        stream: dict[str, dict[str, Any]] = {}
        closed = None
        try:
            while len(stream) < len(stream_calls):
                for result in orjson.loads(await asyncio.wait_for(ws.recv(), 120))["results"]:
                    stream[result["call_id"]] = result
        except ConnectionClosed as exc:
            closed = repr(exc)
        answers = await asyncio.gather(*posts, return_exceptions=True)
        stopped = await stop
    return Drained(answers, stream, closed, stopped, int(stack.state(name, "ExitCode")))


@pytest.fixture(scope="module")
def drained(stack: Stack) -> Drained:
    """`compose stop` (SIGTERM, then compose's stop_grace_period) while four calls run. Last:
    it stops the stack."""
    return asyncio.run(calls_through_a_stop(stack))


def test_sigterm_loses_no_call_in_flight_over_post(drained: Drained) -> None:
    assert drained.stop.returncode == 0, drained.stop.stderr
    for answer in drained.posts:
        assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer
        (result,) = answer.json()["results"]
        assert not result["is_error"] and result["structured"]["value"] == "'done'", result
    # The server drained and exited by itself (uvicorn re-raises SIGTERM: 143), not SIGKILLed
    # (137) when the grace period ran out.
    assert drained.exit_code in (0, 143), drained.exit_code


def test_sigterm_loses_no_call_in_flight_over_the_stream(drained: Drained) -> None:
    assert len(drained.stream) == 2, f"answers lost; the stream closed: {drained.stream_closed}"
    for result in drained.stream.values():
        assert not result["is_error"] and result["structured"]["value"] == "'done'", result
