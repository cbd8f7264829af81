"""Reading one large upstream result over stdio: the SDK's stdio client against ours.

Each size is one ``tools/call`` of ``big(megabytes)`` on tests/support/unruly_upstream.py
(a real subprocess, the official SDK's ClientSession on top), once through the SDK's
``stdio_client`` and once through ``bounded_stdio_client`` (limit raised above the size,
so both deliver the whole result). Reported: seconds for the call, and how much the
process's peak memory (VmHWM, reset before each call) rose. A call past ``--cap`` seconds
is abandoned (the SDK reader is quadratic) and reported as such.

Run: ``.venv/bin/python bench/server/upstream_large_results.py [--sizes 4 8 16 32] [--cap 30]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tool_server.upstream.config import StdioSpec  # noqa: E402
from tool_server.upstream.stdio import bounded_stdio_client  # noqa: E402

UNRULY = str(ROOT / "tests" / "support" / "unruly_upstream.py")


def _peak() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _transport(kind: str, limit: int):
    if kind == "sdk":
        return stdio_client(StdioServerParameters(command=sys.executable, args=[UNRULY]), errlog=sys.stderr)
    spec = StdioSpec(command=sys.executable, args=[UNRULY])
    return bounded_stdio_client(spec, errlog=sys.stderr, max_message_bytes=limit)


async def _one(kind: str, megabytes: float, cap_s: float) -> tuple[float | None, int]:
    transport = _transport(kind, int(megabytes * 3) << 20)  # the message holds the text twice
    async with transport as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        Path("/proc/self/clear_refs").write_text("5")
        before = _peak()
        started = time.perf_counter()
        with anyio.move_on_after(cap_s) as scope:
            result = await session.call_tool("big", {"megabytes": megabytes})
            assert len(result.content[0].text) == int(megabytes * (1 << 20))
        elapsed = None if scope.cancelled_caught else time.perf_counter() - started
        return elapsed, _peak() - before


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--cap", type=float, default=30.0)
    args = parser.parse_args()
    print("| result | SDK stdio_client: s / peak MB | bounded_stdio_client: s / peak MB | time ratio |")
    print("|---|---:|---:|---:|")
    for size in args.sizes:
        sdk_s, sdk_mem = await _one("sdk", size, args.cap)
        ours_s, ours_mem = await _one("ours", size, args.cap)
        sdk = f"{sdk_s:.2f} / {sdk_mem >> 20}" if sdk_s is not None else f"> {args.cap:g} (abandoned)"
        ours = f"{ours_s:.2f} / {ours_mem >> 20}" if ours_s is not None else f"> {args.cap:g}"
        ratio = f"{sdk_s / ours_s:.0f}x" if sdk_s and ours_s else "-"
        print(f"| {size:g} MiB | {sdk} | {ours} | {ratio} |", flush=True)


if __name__ == "__main__":
    anyio.run(main)
