"""ToolClient against the tool server's ASGI app in process (no subprocess, no sockets).

Also where faults are injected into the client's transport: an unexpected exception
must end the calls involved with an error result and leave a traceback in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from protocol import Call, ErrorKind, new_call_id
from tests.support.server import server_config
from tool_server.app import create_app
from tool_server.config import config_from_dict
from trainer_client.client.policies import BatchPolicy, HealthPolicy, RetryPolicy
from trainer_client.client.tool_client import ToolClient

URL = "http://localhost"  # ASGITransport ignores the address; the Host check (api/origin.py) reads the name


class Boom(Exception):
    """A failure no part of the client expects."""


class FaultyTransport(httpx.AsyncBaseTransport):
    """Passes requests to the app, except those ``fails`` picks: those raise ``Boom``."""

    def __init__(self, app: httpx.ASGITransport, fails: Callable[[httpx.Request], bool]) -> None:
        self._app = app
        self._fails = fails

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._fails(request):
            raise Boom(f"injected fault on {request.method} {request.url.path}")
        return await self._app.handle_async_request(request)


@contextlib.asynccontextmanager
async def running_app() -> AsyncIterator[httpx.ASGITransport]:
    """The app with its lifespan run (the executor starts there); a context manager, not a
    fixture, because anyio wants the lifespan entered and left in the same task."""
    app = create_app(config_from_dict(server_config(), environ={}))
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)


@contextlib.asynccontextmanager
async def in_process_client(
    transport: httpx.AsyncBaseTransport, **options: object
) -> AsyncIterator[ToolClient]:
    async with (
        httpx.AsyncClient(transport=transport) as http,
        ToolClient(URL, http=http, health=HealthPolicy(interval_s=0), **options) as client,  # type: ignore[arg-type]
    ):
        yield client


def split_post(request: httpx.Request) -> bool:
    """A split POST carries one call (the batch it relieves has more)."""
    return request.url.path == "/v1/calls" and request.content.count(b'"call_id"') == 1


def calls(name: str, arguments: dict[str, object], n: int) -> list[Call]:
    return [Call(new_call_id(), name, arguments, None) for _ in range(n)]


async def test_calls_tools_and_sessions_against_the_app_in_process() -> None:
    async with running_app() as app:
        async with httpx.AsyncClient(transport=app) as http:
            client = ToolClient(
                URL, http=http, batch=BatchPolicy(window_ms=5), retry=RetryPolicy(timeout_s=30)
            )
            async with client:
                names = {t["name"] for t in await client.list_tools("test")}
                results = await asyncio.gather(*(client.call("echo", {"text": f"t{i}"}) for i in range(50)))
                session = await client.create_session()
                counted = await client.call("count", {}, session=session)
                await client.release_session(session)
            assert client.closed and not http.is_closed  # an injected HTTP client stays the caller's
        assert {"echo", "sleep", "count"} <= names
        assert [r.structured["text"] for r in results] == [f"t{i}" for i in range(50)]
        assert not counted.is_error
        assert client.metrics()["batches"] < 50  # coalesced


async def test_old_keyword_arguments_still_set_the_policies() -> None:
    client = ToolClient(URL, batch_window_ms=7, max_retries=3, health_interval_s=0, split_max=9)
    assert client.batch == BatchPolicy(window_ms=7, split_max=9)
    assert client.retry.max_retries == 3 and client.health.interval_s == 0
    with pytest.raises(TypeError, match="max_batches"):
        ToolClient(URL, max_batches=3)
    await client.aclose()


async def test_an_unexpected_transport_error_fails_every_call_of_the_batch_with_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_app() as app:
        transport = FaultyTransport(app, lambda request: request.url.path == "/v1/calls")
        async with in_process_client(transport) as client:
            results = await asyncio.wait_for(client.call_tools(calls("echo", {"text": "x"}, 5)), timeout=10)
        assert all(r.is_error and r.error.kind == ErrorKind.UNAVAILABLE for r in results)
        assert all("Boom" in r.error.message for r in results)
        assert crash_logged(caplog, "sending a batch")


async def test_an_unexpected_error_in_a_split_post_ends_its_call_with_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The per-call POSTs that relieve a slow batch used to swallow every exception."""

    async with running_app() as app:
        transport = FaultyTransport(app, split_post)
        async with in_process_client(transport, batch=BatchPolicy(split_after_ms=200)) as client:
            await client.call_tools(calls("echo", {}, 2))  # in time: the replica may be split
            started = asyncio.get_running_loop().time()
            results = await asyncio.wait_for(client.call_tools(calls("sleep", {"seconds": 3}, 2)), timeout=10)
            elapsed = asyncio.get_running_loop().time() - started
        assert elapsed < 2.5  # ended by the fault, not by the batch's answer
        assert all(r.is_error and "joining a call" in r.error.message for r in results)
        assert crash_logged(caplog, "joining a call")


async def test_a_bug_while_settling_a_batch_fails_its_calls_instead_of_leaving_them_waiting(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_app() as app:
        async with in_process_client(app) as client:

            async def broken_settle(*args: object) -> None:
                raise Boom("injected fault while settling")

            monkeypatch.setattr(client._dispatch, "_settle", broken_settle)
            results = await asyncio.wait_for(
                client.call_tools(calls("echo", {}, 3), timeout_s=60), timeout=10
            )
        assert all(r.is_error and r.error.kind == ErrorKind.UNAVAILABLE for r in results)
        assert crash_logged(caplog, "sending a batch")


def crash_logged(caplog: pytest.LogCaptureFixture, doing: str) -> bool:
    """An ERROR record about ``doing`` that carries a Boom traceback."""
    return any(
        record.levelno == logging.ERROR
        and doing in record.getMessage()
        and record.exc_info is not None
        and isinstance(record.exc_info[1], Boom)
        for record in caplog.records
    )
