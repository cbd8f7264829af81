"""A tool's fault is a result: never a 500, never a dead server. Only our own bugs are 500s."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import httpx
import pytest

from protocol import decode_results
from tests.support.faulty_tools import FAULTS
from tests.support.server import ServerProcess, running_server, server_config
from tool_server.app import create_app
from tool_server.config import config_from_dict

KINDS = ["faulty_async", "faulty_thread", "faulty_inline"]


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    config = server_config()
    config["tools"] = [
        *config["tools"],
        *({"target": f"tests.support.faulty_tools:{name}", "toolsets": ["test"]} for name in KINDS),
    ]
    with running_server(config) as proc:
        yield proc


@pytest.mark.parametrize("tool", KINDS)
@pytest.mark.parametrize("fault", [*FAULTS, "unprintable"])
def test_every_kind_of_tool_fault_is_an_error_result(srv, tool, fault):
    calls = [
        {"call_id": uuid.uuid4().hex, "name": tool, "arguments": {"fault": fault}},
        {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": "6*7"}},
    ]
    response = httpx.post(srv.url + "/v1/calls", json={"calls": calls}, timeout=30)
    assert response.status_code == 200, response.text
    failed, neighbour = decode_results(response.content)
    assert failed.is_error and failed.error.kind == "tool_error"
    assert neighbour.structured["result"] == 42  # the batch goes on
    assert srv.proc.poll() is None
    assert httpx.get(srv.url + "/healthz").status_code == 200


async def test_only_a_bug_of_ours_is_a_500_and_it_carries_a_request_id(caplog):
    app = create_app(config_from_dict(server_config(), environ={}))

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug in the server")

    app.state.executor.verify_batch = broken  # fault injection: the only way to reach that path
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        with caplog.at_level(logging.ERROR):
            response = await client.post(
                "/v1/verify", json={"requests": [{"verifier": "x", "response": "y"}]}
            )
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    request_id = message.rsplit(" ", 1)[-1]
    assert len(request_id) == 12 and request_id in caplog.text and "a bug in the server" in caplog.text
