"""No tenant can take every session: one token holds at most its share of the session table.

A real server with two tokens and a table of 8 sessions: token A opens sessions until it is
refused, and is refused at its share (3/4 of the table: 6), with a message that names the
key; token B still opens its own; when the table is full, the refusal says so. A server
without tokens has one tenant, which may fill the whole table.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
import yaml

from protocol import ErrorKind, new_session_id
from tests.support.server import REPO, running_server, server_config

pytestmark = pytest.mark.timeout(300)

TOKEN_A = "share-a-token-0123456789"
TOKEN_B = "share-b-token-0123456789"
TABLE = 8


def open_session(url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url + "/v1/sessions", json={"session": new_session_id()}, headers=headers, timeout=30)


def test_one_token_cannot_take_the_whole_session_table() -> None:
    config = server_config(sessions={"max_sessions": TABLE})
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}) as srv:
        opened = 0
        while (answer := open_session(srv.url, TOKEN_A)).status_code == 201:
            opened += 1
            assert opened <= TABLE, "token A filled the whole table"
        assert opened == TABLE * 3 // 4  # the default share
        assert answer.status_code == 429 and answer.headers["Retry-After"], answer.text
        error = answer.json()["error"]
        assert error["kind"] == ErrorKind.OVERLOADED
        assert "sessions.max_sessions_per_tenant" in error["message"] and "DELETE" in error["message"]

        for _ in range(TABLE - opened):  # the rest of the table is still there for token B
            assert open_session(srv.url, TOKEN_B).status_code == 201
        full = open_session(srv.url, TOKEN_B)
        assert full.status_code == 429 and "too many open sessions" in full.json()["error"]["message"]


def test_a_released_session_gives_its_token_room_again() -> None:
    config = server_config(sessions={"max_sessions": TABLE, "max_sessions_per_tenant": 2})
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}) as srv:
        first, _ = (open_session(srv.url, TOKEN_A).json()["session"] for _ in range(2))
        assert open_session(srv.url, TOKEN_A).status_code == 429
        released = httpx.delete(
            f"{srv.url}/v1/sessions/{first}", headers={"Authorization": f"Bearer {TOKEN_A}"}, timeout=30
        )
        assert released.status_code == 200
        assert open_session(srv.url, TOKEN_A).status_code == 201


def test_a_server_without_tokens_has_one_tenant_that_may_fill_the_table() -> None:
    with running_server(server_config(sessions={"max_sessions": 4})) as srv:
        assert [open_session(srv.url, None).status_code for _ in range(5)] == [201] * 4 + [429]


def test_a_share_below_one_is_a_configuration_error(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(server_config(sessions={"max_sessions_per_tenant": 0})))
    done = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "sessions.max_sessions_per_tenant must be at least 1" in done.stderr + done.stdout
