"""A task's simulated user may have tools of its own; the server runs them only for the user.

Any pack: a task lists its user's tools in ``metadata["user_tools"]`` (τ²'s dual control puts
the customer's phone there). A call made as the user carries a user call id
(``protocol.messages.new_user_call_id``), which the policy model never chooses (it writes a
call's name and arguments only): so the agent's call to a user tool is refused, the user's runs
on the session's one world, and the user reaches nothing but its own tools. On a real server
with a tiny pack (``phone_pack``), so nothing of τ² is needed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from protocol import decode_results
from protocol.messages import new_user_call_id
from tests.support.server import ServerProcess, running_server, server_config

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with running_server(server_config(environments=[{"source": "tests.envs.tau2.phone_pack:pack"}])) as srv:
        yield srv


def _session(url: str) -> str:
    session = f"phone-{uuid.uuid4().hex}"
    environment = {"pack": "phone", "task": "phone_off"}
    opened = httpx.post(
        url + "/v1/sessions", json={"session": session, "environment": environment}, timeout=60
    )
    assert opened.status_code == 201, opened.text
    return session


def _calls(url: str, session: str, *calls: tuple[str, str]) -> list[Any]:
    """(who, tool) in order, in one batch; who is 'agent' or 'user'."""
    body = [
        {
            "call_id": new_user_call_id() if who == "user" else uuid.uuid4().hex,
            "name": name,
            "arguments": {},
            "session": session,
        }
        for who, name in calls
    ]
    response = httpx.post(url + "/v1/calls", json={"calls": body}, timeout=120)
    assert response.status_code == 200, response.text
    return decode_results(response.content)


def test_only_the_user_reaches_the_users_tools(server: ServerProcess) -> None:
    session = _session(server.url)
    by_agent, check, by_user, user_reads_line, after = _calls(
        server.url,
        session,
        ("agent", "switch_phone_on"),
        ("agent", "check_line"),
        ("user", "switch_phone_on"),
        ("user", "check_line"),
        ("agent", "check_line"),
    )
    assert by_agent.is_error and by_agent.error.kind.value == "unknown_tool"
    assert "is the user's" in by_agent.text and "ask the user" in by_agent.text
    assert not check.is_error and check.structured["phone_on"] is False  # the agent's call changed nothing
    assert not by_user.is_error and by_user.text == "the phone is on"
    assert (
        user_reads_line.is_error and "may call only its own tools (switch_phone_on)" in user_reads_line.text
    )
    assert after.structured["phone_on"] is True  # one world: the user's call acts on the agent's session
    unbound = f"dual-{uuid.uuid4().hex}"
    (lost,) = _calls(server.url, unbound, ("user", "switch_phone_on"))
    assert lost.is_error and "bind the session to a task" in lost.text
