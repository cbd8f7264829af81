"""A reply frame forged from inside the sandbox is only ever that call's displayed output.

The code a worker runs can find the worker's control pipe and write frames to it (point 9
of the security campaign). The server must never trust a reply beyond display, must not
crash on a malformed one, and the session's next call must still run correctly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxResult, SandboxWorker

LIMITS = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256, max_output_bytes=4096)

# Finds the worker's control pipe (its only write-only pipe) and this call's request.
CONTROL_PIPE = r"""
import fcntl, json, os, stat, sys, threading, time
request = sys._getframe(0).f_back.f_locals["request"]
def write_frame(body):
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                os.write(fd, len(body).to_bytes(4, "big") + body)
        except OSError:
            pass
"""

# Writes FRAME (with this call's sequence number, read from the bootstrap's frame) to the
# worker's control pipe, then goes on running.
FORGE = (
    CONTROL_PIPE
    + r"""
frame = FRAME
if "seq" in request and isinstance(frame, dict):
    frame.setdefault("seq", request["seq"])
write_frame(frame if isinstance(frame, bytes) else json.dumps(frame).encode())
time.sleep(0.3)
'genuine'
"""
)

# Returns at once, leaving a thread that writes a reply frame with this call's number a little
# later: while the next call runs (the worker is stopped between calls).
FORGE_LATER = (
    CONTROL_PIPE
    + r"""
body = json.dumps({"value": "'forged'", "error": None, "exit_code": 0, "seq": request["seq"]}).encode()
threading.Thread(target=lambda: (time.sleep(0.2), write_frame(body)), daemon=True).start()
'first'
"""
)


def forge(frame: object) -> str:
    return FORGE.replace("FRAME", repr(frame))


@pytest.fixture
async def worker() -> AsyncIterator[SandboxWorker]:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    yield worker
    await worker.aclose()


async def test_a_forged_reply_is_shown_as_that_call_and_the_next_call_is_not_confused(
    worker: SandboxWorker,
) -> None:
    frame = {"value": "'forged'", "error": None, "exit_code": 0, "truncated": False}
    forged = await worker.run(forge(frame))
    assert (forged.value, forged.worker_died) == ("'forged'", False)  # display only
    following = await worker.run("6 * 7")  # the genuine reply of the forged call is skipped
    assert (following.value, following.error) == ("42", None), following
    assert (await worker.run("'still' + ' fine'")).value == "'still fine'"


@pytest.mark.parametrize(
    "frame",
    [
        {"value": 5, "error": {"not": "text"}, "exit_code": "boom"},  # wrong types
        {"value": None, "error": None, "exit_code": [1]},
        {"value": None, "error": None, "exit_code": 0, "seq": 10**6},  # a call that never was
        b"[" * 100_000,  # nesting deep enough to blow the JSON decoder's recursion
        b"\xff not json",
    ],
    ids=["types", "list-exit-code", "future-seq", "deep-nesting", "garbage"],
)
async def test_a_malformed_reply_breaks_only_its_own_worker(worker: SandboxWorker, frame: object) -> None:
    result = await worker.run(forge(frame))  # never raises
    assert result.worker_died and "tampered" in (result.error or ""), result
    assert not worker.alive
    fresh = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    try:
        assert (await fresh.run("6 * 7")).value == "42"
    finally:
        await fresh.aclose()


async def test_reply_strings_are_cut_to_the_output_cap(worker: SandboxWorker) -> None:
    frame = {"value": "v" * 100_000, "error": "e" * 100_000, "exit_code": 1}
    result = await worker.run(forge(frame))
    assert result.truncated and len(result.value or "") == len(result.error or "") == LIMITS.max_output_bytes
    assert json.dumps(result.exit_code) == "1"


async def test_two_calls_sent_together_cannot_take_each_others_frames(worker: SandboxWorker) -> None:
    """Hole closed (sandbox review): the sequence number was drawn before a call waited for the
    worker's lock, so two calls sent together got the same one, and a frame forged by the
    first call's code during the second passed as the second call's reply."""
    results: dict[str, SandboxResult] = {}

    async def call(name: str, code: str) -> None:
        results[name] = await worker.run(code)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first", FORGE_LATER)
        tg.start_soon(call, "second", "import time\ntime.sleep(1)\n'second'")
    assert results["first"].value == "'first'", results["first"]
    assert results["second"].value == "'second'", results["second"]
