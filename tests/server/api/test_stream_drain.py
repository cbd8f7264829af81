"""SIGTERM drains ``/v1/stream`` as it drains POSTs: calls in flight finish and their answers come
on the stream, frames sent during the drain are answered ``overloaded`` (never run), then the
connection closes with 1012. A real server subprocess and a real signal; the calls wait at a gate
the test opens once the drain has begun, so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect

from tests.support.gate_tools import started
from tests.support.server import BASE_TOOLS, running_server, server_config

CALLS = 10
DEADLINE_S = 60.0


def body(name: str, **arguments: Any) -> bytes:
    return orjson.dumps({"calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}]})


async def test_sigterm_answers_the_calls_in_flight_on_the_stream_then_closes_1012(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    tools = [*BASE_TOOLS, {"target": "tests.support.gate_tools:gated", "toolsets": ["test"]}]
    config = server_config(tools=tools, server={"shutdown_grace_s": DEADLINE_S})
    with running_server(config) as srv:
        async with connect(srv.url.replace("http://", "ws://") + "/v1/stream", compression=None) as ws:
            sent = [body("gated", gate=str(gate)) for _ in range(CALLS)]
            for frame in sent:
                await ws.send(frame)
            async with asyncio.timeout(DEADLINE_S):
                while started(gate) < CALLS:
                    await asyncio.sleep(0.02)

            srv.proc.send_signal(signal.SIGTERM)
            # The drain has begun when a new frame is refused, not run.
            async with asyncio.timeout(DEADLINE_S):
                while True:
                    await ws.send(body("calculator", expression="6*7"))
                    (result,) = orjson.loads(await ws.recv())["results"]
                    if result["error"] is not None:
                        break
            assert result["error"]["kind"] == "overloaded" and "shutting down" in result["error"]["message"]

            gate.touch()  # the calls in flight finish during the drain
            answered = {}
            async with asyncio.timeout(DEADLINE_S):
                while len(answered) < CALLS:
                    (result,) = orjson.loads(await ws.recv())["results"]
                    answered[result["call_id"]] = result
            expected = {orjson.loads(frame)["calls"][0]["call_id"] for frame in sent}
            assert set(answered) == expected
            assert all(r["error"] is None and r["structured"]["passed"] for r in answered.values())
            await asyncio.wait_for(ws.wait_closed(), DEADLINE_S)
            assert ws.close_code == 1012
        assert srv.proc.wait(DEADLINE_S) in (0, -signal.SIGTERM)
