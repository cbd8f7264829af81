"""Memory soak: does the server's RSS come back after a burst, once it is idle?

Issue 36 point 7: a 5-minute soak left a server at 329 MB from 118 MB, still 329 MB idle;
expired results stayed 90 s past their lifetime; 20 half-sent 16 MiB frames held +264 MB
after their connections closed. This drives, for ``--seconds`` (default 60):

* ``--callers`` POST callers, each sending batches of 32 ``echo`` calls with 2,000 characters of
  text, back to back (every result is kept for retries: ``idempotency.ttl_s`` is ``--ttl-s``);
* two ``/v1/stream`` connections sending frames of 4 such calls;
* halfway, 20 stream connections that each declare a 16 MiB frame, send half of it, and close.

then lets the server idle for the results' lifetime plus ``--idle-s``. It samples the server's
RSS (``/proc/PID/status``) before the load, at its peak, at the end of the load and after the
idle wait, with the kept results (``/metrics``). ``--base REF`` runs the same soak on a git
ref's tree (``git archive``) after this one's, so the table shows both. Both servers use the
tests' light config with the given result lifetime, and their defaults for everything else.

    python bench/server/memory_soak.py [--seconds 60] [--ttl-s 20] [--idle-s 25] [--base REF]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import yaml
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.git_ref import export_ref  # noqa: E402
from tests.support.processes import started  # noqa: E402
from tests.support.server import server_config  # noqa: E402

TEXT = "x" * 2000
HALF_FRAMES, HALF_FRAME_BYTES = 20, 16 * 1024 * 1024


@dataclass
class Soak:
    name: str
    rss_mb: dict[str, float] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    errors: int = 0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def kept_results(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("toolfactory_store_entries{")
    )


def batch(size: int) -> bytes:
    calls = [{"call_id": uuid.uuid4().hex, "name": "echo", "arguments": {"text": TEXT}} for _ in range(size)]
    return orjson.dumps({"calls": calls})


async def post_caller(url: str, until: float, soak: Soak) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while time.monotonic() < until:
            response = await client.post(
                "/v1/calls", content=batch(32), headers={"Content-Type": "application/json"}
            )
            soak.calls += 32
            soak.errors += response.status_code != 200


async def stream_caller(url: str, until: float, soak: Soak) -> None:
    async with connect(url.replace("http://", "ws://") + "/v1/stream", compression=None) as ws:
        while time.monotonic() < until:
            await ws.send(batch(4))
            results = orjson.loads(await ws.recv())["results"]
            soak.calls += 4
            soak.errors += sum(r["error"] is not None for r in results)


def half_sent_frame(url: str) -> None:
    """Open a stream, declare a 16 MiB frame, send half of it, close."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /v1/stream HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(4096)
        mask = os.urandom(4)
        sock.sendall(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", HALF_FRAME_BYTES) + mask)
        chunk = os.urandom(1 << 20)
        for _ in range(HALF_FRAME_BYTES // 2 // len(chunk)):
            sock.sendall(chunk)  # unmasked noise: the server only holds it until the frame is whole


async def load(url: str, pid: int, seconds: float, callers: int, soak: Soak, half: bool = True) -> None:
    until = time.monotonic() + seconds
    peak = 0.0

    async def sample() -> None:
        nonlocal peak
        while time.monotonic() < until:
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(1)

    async def half_frames() -> None:
        soak.rss_mb["after half frames"] = 0.0
        if not half:
            return
        await asyncio.sleep(seconds / 2)
        await asyncio.gather(*(asyncio.to_thread(half_sent_frame, url) for _ in range(HALF_FRAMES)))
        peak_after = rss_mb(pid)
        soak.rss_mb["after half frames"] = peak_after

    await asyncio.gather(
        sample(),
        half_frames(),
        *(post_caller(url, until, soak) for _ in range(callers)),
        *(stream_caller(url, until, soak) for _ in range(2)),
    )
    soak.rss_mb["peak"] = max(peak, soak.rss_mb["after half frames"])


@contextlib.contextmanager
def serve(root: Path, ttl_s: float) -> Iterator[tuple[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(yaml.safe_dump(server_config(idempotency={"ttl_s": ttl_s})))
        cmd = [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(config)]
        cmd += ["--host", "127.0.0.1", "--port", "0"]
        with started(cmd, ready_line=r"Uvicorn running on (http://\S+)", timeout_s=180, cwd=root) as process:
            assert process.match is not None
            url = process.match.group(1)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                        break
                time.sleep(0.1)
            yield url, process.proc.pid


def soak_one(root: Path, name: str, args: argparse.Namespace) -> Soak:
    soak = Soak(name)
    with serve(root, args.ttl_s) as (url, pid):
        asyncio.run(load(url, pid, 3, 1, Soak("warm-up"), half=False))  # imports, first allocations
        time.sleep(2)
        soak.rss_mb["before"] = rss_mb(pid)
        soak.kept["before"] = kept_results(url)
        asyncio.run(load(url, pid, args.seconds, args.callers, soak))
        soak.rss_mb["end of load"] = rss_mb(pid)
        soak.kept["end of load"] = kept_results(url)
        time.sleep(args.ttl_s + args.idle_s)
        soak.rss_mb["idle"] = rss_mb(pid)
        soak.kept["idle"] = kept_results(url)
    return soak


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration (default 60)")
    parser.add_argument(
        "--ttl-s", type=float, default=20.0, help="idempotency.ttl_s of the servers (default 20)"
    )
    parser.add_argument("--idle-s", type=float, default=25.0, help="idle wait past the lifetime (default 25)")
    parser.add_argument("--callers", type=int, default=8, help="POST callers (default 8)")
    parser.add_argument("--base", metavar="REF", help="also soak this git ref's tree, after this one")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[2]
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=sys.stderr)
    soaks = [soak_one(root, "this tree", args)]
    if args.base is not None:
        base = export_ref(args.base)
        try:
            soaks.append(soak_one(Path(base), args.base, args))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=sys.stderr)
    print(
        "| tree | calls (errors) | RSS before | after 20 half frames | peak | end of load | idle | idle / before | kept results end of load → idle |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for s in soaks:
        r = s.rss_mb
        print(
            f"| {s.name} | {s.calls:,} ({s.errors}) | {r['before']:.0f} MB | {r['after half frames']:.0f} MB | "
            f"{r['peak']:.0f} MB | {r['end of load']:.0f} MB | {r['idle']:.0f} MB | {r['idle'] / r['before']:.2f}× | "
            f"{s.kept['end of load']:,} → {s.kept['idle']:,} |"
        )


if __name__ == "__main__":
    main()
