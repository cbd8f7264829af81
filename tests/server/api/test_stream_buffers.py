"""A stream connection lost with a frame half received gives its memory back at once
(api/ws_frames.py ``connection_lost``), not when a full garbage collection finds the protocol:
the scope, the app's task and the transport hold it in cycles. In this process, on uvicorn's
protocol driven by hand, with tracemalloc: deterministic.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import tracemalloc
from typing import Any

import uvicorn
from uvicorn.server import ServerState
from websockets.utils import apply_mask

from tool_server.api.connections import ConnectionGuard, ConnectionLimits
from tool_server.api.ws_frames import FRAMES_EXTENSION, guarded_websocket_protocol

FRAME = 4 * 1024 * 1024  # what the client declares
SENT = FRAME // 2  # what it sends before it goes


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)


class Receiver:
    def frame(self, data: bytes, text: bool) -> None:
        raise AssertionError("no frame is whole")

    def drain(self) -> None:
        pass


async def accepting_app(scope: dict, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "websocket.accept"})
    scope["extensions"][FRAMES_EXTENSION].attach(Receiver())
    await receive()  # the disconnect


def header(size: int, *, fin: bool) -> tuple[bytes, bytes]:
    key = os.urandom(4)
    return bytes([(0x80 if fin else 0) | 2, 0x80 | 127]) + struct.pack("!Q", size) + key, key


async def connected() -> Any:
    config = uvicorn.Config(accepting_app, ws_max_size=2 * FRAME, ws_ping_interval=None)
    config.load()
    protocol_class = guarded_websocket_protocol(ConnectionGuard(ConnectionLimits()))
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(Transport())
    key = base64.b64encode(os.urandom(16)).decode()
    protocol.data_received(
        f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    for _ in range(100):  # the app accepts and attaches in its task
        await asyncio.sleep(0)
        if protocol._receiver is not None:
            return protocol
    raise AssertionError("the app did not attach")


async def test_a_half_received_frame_is_freed_when_the_connection_is_lost() -> None:
    for fin in (True, False):  # read by our reader; a fragment: read by websockets' parser
        protocol = await connected()
        head, key = header(FRAME, fin=fin)
        tracemalloc.start()
        try:
            protocol.data_received(head)
            for _ in range(SENT // 65536):
                protocol.data_received(apply_mask(os.urandom(65536), key))
            holding, _ = tracemalloc.get_traced_memory()
            assert holding >= SENT, holding
            protocol.connection_lost(None)
            left, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # The protocol object itself is still referenced here, as a cycle would keep it.
        assert left < SENT // 8, (fin, holding, left)
        await asyncio.sleep(0)  # the app's task sees the disconnect
