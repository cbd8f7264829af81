"""A minimal keep-alive HTTP/1.1 load generator for the benchmarks.

General clients (httpx) spend ~100 µs of Python per request, which would make the
client, not the server, the bottleneck on a 2-core machine. This one writes a
prebuilt request and reads a Content-Length response on a raw asyncio stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class LoadResult:
    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port, limit=2**22)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value)
            elif lname == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
            return status, body
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def build_post(url: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    parts = urlsplit(url)
    lines = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def run_load(
    url: str,
    make_request: Callable[[int], bytes],
    *,
    concurrency: int,
    total_requests: int,
    check: Callable[[int, bytes], bool] | None = None,
) -> LoadResult:
    """``concurrency`` callers, each on its own keep-alive connection, until ``total_requests`` are done."""
    parts = urlsplit(url)
    result = LoadResult()
    counter = iter(range(total_requests))

    async def caller() -> None:
        conn = await Connection.open(parts.hostname or "127.0.0.1", parts.port or 80)
        try:
            for i in counter:
                raw = make_request(i)
                start = time.perf_counter()
                try:
                    status, body = await conn.request(raw)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    result.errors += 1
                    conn.close()
                    conn = await Connection.open(parts.hostname or "127.0.0.1", parts.port or 80)
                    continue
                result.latencies.append(time.perf_counter() - start)
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status != 200 or (check is not None and not check(status, body)):
                    result.errors += 1
                result.requests += 1
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - start
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
