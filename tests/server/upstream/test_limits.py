"""What an upstream can make the server hold: one message at most ``max_message_bytes``.

A real stdio subprocess (tests/support/unruly_upstream.py) answers with more than the limit,
or writes a line that never ends; the server process's peak memory (VmHWM, reset first)
stays far below what the upstream wrote, and the connection goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol import ErrorKind
from tests.server.upstream.test_proxying import wait_until
from tests.server.upstream.test_unruly import UNRULY, _written
from tests.support.openai_server import serve_in_thread
from tool_server.upstream.hosting import UpstreamServer
from tool_server.upstream.stdio import LineSplitter, Oversize, stand_in

pytestmark = pytest.mark.timeout(180)

LIMIT = 1 << 20  # 1 MiB


def _reset_peak_memory() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _peak_memory() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _unruly() -> UpstreamServer:
    return UpstreamServer(
        "unruly",
        {"command": sys.executable, "args": [UNRULY]},
        max_message_bytes=LIMIT,
        health_interval_s=None,
    )


async def test_a_result_over_the_limit_fails_its_call_without_being_held() -> None:
    # Before: the SDK's reader kept the whole 32 MiB line (copying it once per 64 KiB chunk)
    # and the call succeeded; a larger one grew the server's memory without limit.
    up = _unruly()
    await up.start()
    try:
        assert not (await up.call("pid", {})).is_error
        _reset_peak_memory()
        before = _peak_memory()
        result = await up.call("big", {"megabytes": 32}, timeout_s=120)
        grown = _peak_memory() - before
        assert result.is_error
        assert result.error is not None and result.error.kind == ErrorKind.TOO_LARGE
        assert f"{LIMIT} byte limit (max_message_bytes)" in result.text
        assert grown < 8 << 20, f"peak memory grew by {grown} bytes"
        # The same connection goes on: a result under the limit comes through whole.
        small = await up.call("big", {"megabytes": 0.25})  # twice in the message: text and structured
        assert not small.is_error and len(small.text) == 1 << 18
        assert up.state == "ready"
    finally:
        await up.stop()


async def test_a_line_that_does_not_end_is_not_held() -> None:
    # 256 MiB with no newline (then the answer, on the same line: its id is not in the
    # head, so the call is not failed at once, only at its deadline or when cancelled).
    up = _unruly()
    await up.start()
    try:
        pid = (await up.call("pid", {})).structured["result"]
        _reset_peak_memory()
        before = _peak_memory()
        flood = asyncio.create_task(up.call("stdout_flood", {"megabytes": 256}, timeout_s=120))
        await wait_until(lambda: _written(pid) > 256 << 20, timeout_s=120)
        grown = _peak_memory() - before
        flood.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flood
        assert grown < 16 << 20, f"peak memory grew by {grown} bytes"
        assert (await up.call("pid", {})).structured["result"] == pid  # same process, still answering
    finally:
        await up.stop()


def test_lines_are_split_whole_and_an_oversize_one_is_cut_once() -> None:
    lines = LineSplitter(limit=8)
    assert lines.feed(b"ab") == []
    assert lines.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    (cut,) = lines.feed(b"0123456789")  # "f" + 10 bytes: over the limit as it arrives
    assert isinstance(cut, Oversize) and cut.head == b"f0123456789" and cut.limit == 8
    assert lines.feed(b"x" * 100) == []  # the rest of that line is dropped, not reported again
    assert lines.feed(b"yz\nok\n") == [b"ok"]


def test_an_oversize_answer_fails_only_the_request_whose_top_level_id_it_carries() -> None:
    # Writers put the id first (Python SDK) or last (TypeScript SDK: {result, jsonrpc, id}).
    # Before: the first "id" anywhere in the head was taken, so a result holding {"id": 0}
    # (a search hit, a row) failed request 0 -- another call -- and left its own to time out.
    first = stand_in(Oversize(b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"id":0', 1024))
    assert first.message.id == 7  # type: ignore[union-attr]
    nested_only = stand_in(Oversize(b'{"result":{"content":[{"type":"text","id":0,"text":"', 1024))
    assert isinstance(nested_only, ValueError)  # its own id is past the head: no call is failed
    in_a_string = stand_in(Oversize(b'{"result":{"text":"\\"id\\": 1, ","jsonrpc":"2.0"', 1024))
    assert isinstance(in_a_string, ValueError)
    request = stand_in(Oversize(b'{"jsonrpc":"2.0","id":2,"method":"sampling/createMessage"', 1024))
    assert isinstance(request, ValueError)  # a request of its own: nothing of ours to fail


def test_the_limit_is_a_positive_number_of_bytes() -> None:
    with pytest.raises(ValueError, match="max_message_bytes must be a positive whole number"):
        UpstreamServer("bad", {"command": "true"}, max_message_bytes=0)


def _big_http_app(json_response: bool) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("web")

    @server.tool(description="Return `megabytes` MiB of text.")
    def big(megabytes: float) -> str:
        return "x" * int(megabytes * (1 << 20))

    return server.streamable_http_app(json_response=json_response)


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_an_http_answer_over_the_limit_fails_its_call_and_the_connection_goes_on(
    json_response: bool,
) -> None:
    # Before: an SSE event over the SDK's own 1 MiB default failed the call as "closed the
    # connection" and reconnected; a JSON body was read whole, however large.
    with serve_in_thread(_big_http_app(json_response)) as url:
        limit = 2 << 20  # above the SDK's own 1 MiB SSE default: the option must reach it
        up = UpstreamServer("web", {"url": url + "/mcp"}, max_message_bytes=limit, health_interval_s=None)
        await up.start()
        try:
            result = await up.call("big", {"megabytes": 4})
            assert result.error is not None and result.error.kind == ErrorKind.TOO_LARGE, result.text[:200]
            assert f"{limit} byte limit" in result.text
            under = await up.call("big", {"megabytes": 0.75})  # 1.5 MiB as text and structured
            assert not under.is_error and len(under.text) == 3 << 18
            assert up.state == "ready"
        finally:
            await up.stop()
