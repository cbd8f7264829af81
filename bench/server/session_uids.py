"""What a uid of its own costs a ``per_session`` upstream process: start time, with and without.

Each start is one session's instance (``UpstreamServer.spawn_instance`` + ``start``) of
tests/support/files_upstream.py, a real subprocess (the official SDK's MCPServer on the
system's Python 3.11, the venv's packages on its path, so that other users can run it), until
its tool list is read; then it is stopped. The two settings alternate, ``--repeats`` starts
each, run as root (a uid needs it). Reported: median and quartiles of the start, and the ratio.

Run (as root): ``.venv/bin/python bench/server/session_uids.py [--repeats 20]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tool_server.upstream.server import UpstreamServer  # noqa: E402

FILES = str(ROOT / "tests" / "support" / "files_upstream.py")
SYSTEM_PYTHON = "/usr/bin/python3.11"
PACKAGES = str(next(Path(sys.prefix, "lib").glob("python3.*/site-packages")))


def template(own_uid: bool) -> UpstreamServer:
    spec = {
        "command": SYSTEM_PYTHON,
        "args": [FILES, "--dir", "${session_dir}"],
        "env": {"PYTHONPATH": PACKAGES},
    }
    return UpstreamServer("files", spec, per_session=True, session_uid=own_uid, connect_timeout_s=60)


async def one_start(parent: UpstreamServer, number: int) -> float:
    started = time.perf_counter()
    instance = parent.spawn_instance(f"bench-{number}")
    await instance.start()
    took = time.perf_counter() - started
    assert instance.healthy, instance.last_error
    await instance.stop()
    return took


async def main(repeats: int) -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: a uid of its own needs it")
    parents = {False: template(False), True: template(True)}
    for parent in parents.values():
        await parent.start()  # its tool list, read once; each instance reads its own
    took: dict[bool, list[float]] = {False: [], True: []}
    for number in range(repeats + 1):
        for own_uid, parent in parents.items():
            seconds = await one_start(parent, number)
            if number:  # the first of each warms the page cache
                took[own_uid].append(seconds)
    for parent in parents.values():
        await parent.stop()
    for own_uid, label in ((False, "server's uid"), (True, "a uid of its own")):
        q = statistics.quantiles(took[own_uid], n=4)
        print(
            f"{label:>17}: start {statistics.median(took[own_uid]) * 1000:6.0f} ms (quartiles {q[0] * 1000:.0f}-{q[2] * 1000:.0f})"
        )
    ratio = statistics.median(took[True]) / statistics.median(took[False])
    print(f"ratio (own uid / server's): {ratio:.2f}x over {repeats} starts each, alternating")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    anyio.run(main, parser.parse_args().repeats)
