"""A blocking wrapper around ToolClient for scripts and notebooks.

Notebooks already run an event loop in the main thread, so ``asyncio.run`` is not
an option there; instead the wrapper owns a private loop in a daemon thread and
hands each request to it. Every method blocks until its answer arrives.

    with SyncToolClient("http://127.0.0.1:8000") as tools:
        print(tools.call("calculator", {"expression": "2+2"}).text)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from protocol import Call, Result, VerifyRequest, VerifyResult
from trainer_client.client.tool_client import ToolClient

T = TypeVar("T")


class SyncToolClient:
    """Same options as ``ToolClient``; methods block instead of returning coroutines."""

    def __init__(self, urls: str | Sequence[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="SyncToolClient", daemon=True)
        self._thread.start()
        self._closed = False

        async def build() -> ToolClient:
            return ToolClient(urls, **options)

        try:
            self._client = self._run(build())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("SyncToolClient is closed")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout_s: float | None = None,
    ) -> Result:
        """Run one tool call; errors come back as a Result with ``is_error`` set."""
        return self._run(self._client.call(name, arguments, session=session, timeout_s=timeout_s))

    def call_tools(self, calls: Sequence[Call], *, timeout_s: float | None = None) -> list[Result]:
        """Run several calls in one batch; results in order."""
        return self._run(self._client.call_tools(calls, timeout_s=timeout_s))

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        return self._run(self._client.verify(requests))

    def list_tools(self, toolset: str | None = None) -> list[dict[str, Any]]:
        return self._run(self._client.list_tools(toolset))

    def create_session(self) -> str:
        return self._run(self._client.create_session())

    def lease_session(self, session_id: str) -> None:
        """Keep a session open on the server until ``release_session`` (``ToolClient.lease_session``)."""

        async def lease() -> None:
            self._client.lease_session(session_id)

        self._run(lease())

    def release_session(self, session_id: str) -> None:
        self._run(self._client.release_session(session_id))

    def check_health(self) -> dict[str, bool]:
        return self._run(self._client.check_health())

    def metrics(self) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            return self._client.metrics()

        return self._run(read())

    def close(self) -> None:
        """Close the HTTP client and stop the background loop (idempotent)."""
        if self._closed:
            return
        try:
            self._run(self._client.aclose(), timeout=30)
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncToolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
