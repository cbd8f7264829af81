"""``/v1/stream`` in this process (Starlette's test client: frames through ASGI ``receive()``),
for what only shows inside: how often a connection reads its handshake."""

from __future__ import annotations

import uuid

import orjson
import pytest
from starlette.testclient import TestClient

from tests.support.server import BASE_TOOLS
from tool_server.api import routes
from tool_server.app import create_app
from tool_server.config import config_from_dict
from tool_server.sessions import INSTANCE_HEADER


def test_the_handshakes_instance_header_is_read_once_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_dict({"tools": BASE_TOOLS, "workbench": {"enabled": False}}, environ={})
    app = create_app(config, bind_host="127.0.0.1")
    reads = []
    read = routes.request_header

    def counted(scope, name):  # type: ignore[no-untyped-def]
        if name == INSTANCE_HEADER.encode():
            reads.append(scope["type"])
        return read(scope, name)

    monkeypatch.setattr(routes, "request_header", counted)
    with (
        TestClient(app) as client,
        client.websocket_connect("/v1/stream", headers={"Host": "127.0.0.1"}) as ws,
    ):
        for i in range(3):
            call = {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": f"{i}+1"}}
            ws.send_bytes(orjson.dumps({"calls": [call]}))
            (result,) = orjson.loads(ws.receive_bytes())["results"]
            assert result["call_id"] == call["call_id"] and result["error"] is None
    assert reads == ["websocket"]  # at the handshake, not once per frame
