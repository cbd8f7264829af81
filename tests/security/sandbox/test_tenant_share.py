"""One tenant's python sessions never evict another tenant's idle interpreter.

Hole closed (issue 30, point 9, python interpreters): the fleet's limit was shared first come,
first served, and a new session past it evicted the least recently used idle interpreter
of anyone: 65 sessions of one token evicted another token's idle interpreter, and its
variables with it. Now each tenant holds at most ``max_workers_per_tenant`` interpreters
(3/4 of ``max_workers`` by default) and a new session evicts only its own tenant's idle
ones. Against a real server with two tokens; real confined workers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from protocol import Result, decode_results
from tests.support.server import ServerProcess, running_server, server_config

TOKEN_A = "tenant-a-token-0123456789"
TOKEN_B = "tenant-b-token-0123456789"
PYTHON = {
    "target": "tools.python_tool:PythonTool",
    "toolsets": ["default"],
    "args": {"pool_size": 0, "max_workers": 4},
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config()
    config["tools"] = [*config["tools"], PYTHON]
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}) as srv:
        yield srv


def run(srv: ServerProcess, token: str, session: str, code: str) -> Result:
    call = {"call_id": uuid.uuid4().hex, "name": "python", "arguments": {"code": code}, "session": session}
    response = httpx.post(
        srv.url + "/v1/calls",
        json={"calls": [call]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def text(result: Result) -> Any:
    assert not result.is_error, result.error
    return result.text


def test_one_tenants_sessions_evict_only_their_own_idle_interpreters(server: ServerProcess) -> None:
    b_session = f"b-{uuid.uuid4().hex}"
    assert text(run(server, TOKEN_B, b_session, "x = 'b keeps this'\nx")) == "'b keeps this'"
    a_sessions = [f"a{n}-{uuid.uuid4().hex}" for n in range(5)]
    for n, session in enumerate(a_sessions):  # past its share of 3 (of 4), and past the fleet's 4
        assert text(run(server, TOKEN_A, session, f"y = {n}\ny")) == str(n)
    assert text(run(server, TOKEN_B, b_session, "x")) == "'b keeps this'"  # B's interpreter lives
    evicted = run(server, TOKEN_A, a_sessions[0], "y")  # A made room from its own sessions
    assert evicted.is_error and evicted.error is not None
    assert "evicted" in evicted.error.message and "share of 3 interpreters" in evicted.error.message
    assert text(run(server, TOKEN_A, a_sessions[-1], "y")) == "4"
