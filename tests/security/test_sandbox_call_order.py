"""Calls queued on one worker each get a sequence number of their own.

Hole closed (sandbox review): the number was drawn before the call waited for the worker's
lock, so two calls sent together got the same one; a frame forged by the first call's code
and written during the second then passed as the second call's reply (the server skips
frames of earlier calls by their number). Real worker, real forged frame.
"""

from __future__ import annotations

import anyio

from tools.sandbox import SandboxLimits, SandboxResult, SandboxWorker

LIMITS = SandboxLimits(timeout_s=20, memory_mb=256)

# Returns at once, leaving a thread that writes a reply frame with this call's number to the
# worker's control pipe a little later: while the next call runs (the worker is stopped between).
FORGE_LATER = r"""
import fcntl, json, os, stat, sys, threading, time
seq = sys._getframe(0).f_back.f_locals["request"]["seq"]
body = json.dumps({"value": "'forged'", "error": None, "exit_code": 0, "seq": seq}).encode()
def later():
    time.sleep(0.2)
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                os.write(fd, len(body).to_bytes(4, "big") + body)
        except OSError:
            pass
threading.Thread(target=later, daemon=True).start()
'first'
"""


async def test_two_calls_sent_together_cannot_take_each_others_frames() -> None:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    results: dict[str, SandboxResult] = {}

    async def call(name: str, code: str) -> None:
        results[name] = await worker.run(code)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "first", FORGE_LATER)
            tg.start_soon(call, "second", "import time\ntime.sleep(1)\n'second'")
        assert results["first"].value == "'first'", results["first"]
        assert results["second"].value == "'second'", results["second"]
    finally:
        await worker.aclose()
