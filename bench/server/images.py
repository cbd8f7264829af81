"""What image results cost the server, and that text results cost no more than before.

In process, no HTTP (the executor's own cost, process CPU time, fastest of ``--repeats``):

* text paths, 64-call batches: ``echo`` (a dict: the common case) and ``text_output`` (a
  ``ToolOutput`` of text: the path that now looks for image blocks). ``--tree DIR`` runs
  these against another checkout (e.g. the commit before image support, unpacked with
  ``git archive``), for a before/after on the same machine;
* image paths (this tree only): cache hits of a 768x576 PNG view (~60 kB; the kept image
  is handed out again, not copied) and first calls that return it (the limit check reads
  the header), each as a ratio to ``echo``;
* the header read (``protocol.images.image_info``) against decoding the image with Pillow,
  for a PNG view and a 2048x1536 JPEG with 60 kB of metadata in front of its frame header.

    .venv/bin/python bench/server/images.py [--tree DIR] [--calls 64000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import sys
import time
from pathlib import Path
from typing import Any

BATCH = 64
_IMAGE: dict[str, Any] = {}  # the PNG the image tools return, made once
_counter = itertools.count()


def text_output(text: str = "") -> Any:
    from protocol import ToolOutput

    return ToolOutput.text(text, {"length": len(text)})


def image_output(seed: int = 0) -> Any:
    from protocol import ToolOutput

    return ToolOutput([{"type": "text", "text": "a view"}, _IMAGE["block"]], {"seed": seed})


def _configure(tree: Path | None) -> None:
    sys.path.insert(0, str(tree or Path(__file__).resolve().parents[2]))
    from protocol import tool

    tool(name="text_output", blocking=False)(text_output)
    tool(name="image_output", blocking=False, cacheable=True)(image_output)


async def _per_call_us(name: str, arguments: Any, calls: int, *, images: bool = False) -> float:
    from protocol import Call
    from tool_server.app import build_registry
    from tool_server.config import config_from_dict
    from tool_server.executor.executor import Executor

    tools = [{"target": "tools.testing:echo"}, {"target": "__main__:text_output"}]
    if images:
        tools.append({"target": "__main__:image_output"})
    config = config_from_dict({"tools": tools}, environ={})
    executor = Executor(build_registry(config), config)
    await executor.start()
    try:
        warm = [Call(f"w{next(_counter)}", name, arguments(i)) for i in range(BATCH)]
        await executor.run_batch(warm)
        batches = [
            [Call(f"c{next(_counter)}", name, arguments(b * BATCH + i)) for i in range(BATCH)]
            for b in range(calls // BATCH)
        ]
        start = time.process_time()
        for batch in batches:
            results = await executor.run_batch(batch)
            assert not results[0].is_error, results[0].text
        return (time.process_time() - start) / (len(batches) * BATCH) * 1e6
    finally:
        await executor.stop()


def _fastest(repeats: int, measure: Any) -> float:
    return min(measure() for _ in range(repeats))


def _view_png() -> bytes:
    from tools.envs.image_env import pack

    environment = pack(tasks=1)
    output = environment.call(environment.new_world(environment.tasks[0]), "view_image", {})
    return base64.b64decode(output.content[1]["data"])


def _big_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.effect_noise((2048, 1536), 64).convert("RGB").save(
        buffer, "JPEG", exif=b"Exif\x00\x00" + bytes(60_000)
    )
    return buffer.getvalue()


def _header_rows(repeats: int) -> list[str]:
    from PIL import Image

    from protocol.images import image_info

    rows = []
    for label, raw in [("768x576 PNG view", _view_png()), ("2048x1536 JPEG, 60 kB EXIF", _big_jpeg())]:
        data = base64.b64encode(raw).decode()

        def header(data: str = data) -> float:
            start = time.perf_counter()
            for _ in range(200):
                image_info(data)
            return (time.perf_counter() - start) / 200 * 1e6

        def decode(data: str = data) -> float:
            start = time.perf_counter()
            for _ in range(5):
                Image.open(io.BytesIO(base64.b64decode(data))).load()
            return (time.perf_counter() - start) / 5 * 1e6

        h, d = _fastest(repeats, header), _fastest(repeats, decode)
        rows.append(f"| {label} ({len(raw) // 1024} kB) | {h:,.1f} | {d:,.0f} | {d / h:,.0f}x |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree", type=Path, default=None, help="import the server from this checkout (text paths only)"
    )
    parser.add_argument("--calls", type=int, default=64_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    _configure(args.tree)
    images = args.tree is None

    def run(name: str, arguments: Any) -> float:
        return _fastest(
            args.repeats, lambda: asyncio.run(_per_call_us(name, arguments, args.calls, images=images))
        )

    echo = run("echo", lambda i: {"text": "hi"})
    text = run("text_output", lambda i: {"text": "hi"})
    print(
        f"tree: {args.tree or 'this checkout'}; {args.calls} calls in batches of {BATCH}, fastest of {args.repeats}"
    )
    print("\n| path (executor in process) | µs per call | vs echo |\n|---|---:|---:|")
    print(f"| echo (dict output) | {echo:.2f} | 1.00 |")
    print(f"| text_output (ToolOutput of text) | {text:.2f} | {text / echo:.2f} |")
    if not images:
        return
    from protocol.images import image_block

    _IMAGE["block"] = image_block(_view_png())
    hit = run("image_output", lambda i: {"seed": 0})
    first = run("image_output", lambda i: {"seed": next(_counter)})
    size = len(_IMAGE["block"]["data"]) * 3 // 4 // 1024
    print(f"| image_output, cache hit ({size} kB PNG) | {hit:.2f} | {hit / echo:.2f} |")
    print(f"| image_output, a new call (header checked, kept) | {first:.2f} | {first / echo:.2f} |")
    print("\n| image | header read µs | Pillow decode µs | ratio |\n|---|---:|---:|---:|")
    print("\n".join(_header_rows(args.repeats)))


if __name__ == "__main__":
    main()
