"""Built packs: what running a generated tool in the sandbox costs per call.

One lookup tool (``get_book``) and one write (``borrow_book``) of the builder's library
world, on worlds of 10 and 1,000 books, called three ways side by side in one run:
(a) the same functions as trusted in-process ``EnvTool``s (written here, not generated),
(b) sandboxed through ``SandboxExecutor`` with reused workers (the default), and
(c) sandboxed with a fresh interpreter per call (``calls_per_worker=1``). A sandboxed call
serialises the tables the tool declares, so its cost grows with them; results in
bench/README.md.

    .venv/bin/python bench/environments/builder.py [--calls 200]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tools.envs.builder.loader import assemble_source, built_tools
from tools.envs.builder.sandboxed import SandboxExecutor
from tools.envs.pack import EnvTool, Pack, PackInfo

GET = """def get_book(world, book_id):
    book = world["books"].get(book_id)
    if book is None:
        raise ToolError(f"no book {book_id}")
    return book"""
BORROW = """def borrow_book(world, member_id, book_id):
    book = world["books"][book_id]
    book["available"] = False
    world["members"][member_id]["borrowed"].append(book_id)
    return {"book_id": book_id, "title": book["title"]}"""
ID = {"type": "string"}
DOCS = [
    {"name": "get_book", "description": "", "parameters": {"type": "object", "properties": {"book_id": ID}},
     "reads": ["books"], "writes": []},
    {"name": "borrow_book", "description": "",
     "parameters": {"type": "object", "properties": {"member_id": ID, "book_id": ID}},
     "reads": [], "writes": ["books", "members"]},
]  # fmt: skip


def get_book(world: Any, book_id: str) -> Any:
    return world["books"][book_id]


def borrow_book(world: Any, member_id: str, book_id: str) -> Any:
    book = world["books"][book_id]
    book["available"] = False
    world["members"][member_id]["borrowed"].append(book_id)
    return {"book_id": book_id, "title": book["title"]}


def _state(books: int) -> dict[str, dict[str, Any]]:
    return {
        "books": {
            f"b{i}": {"book_id": f"b{i}", "title": f"Title {i}", "available": True} for i in range(books)
        },
        "members": {"m1": {"member_id": "m1", "borrowed": []}},
    }


def _per_call_us(pack: Pack, calls: int) -> tuple[float, float]:
    timings = []
    for name, arguments in (
        ("get_book", {"book_id": "b1"}),
        ("borrow_book", {"member_id": "m1", "book_id": "b1"}),
    ):
        start = time.perf_counter()
        for _ in range(calls):
            pack.call(pack.new_world(), name, arguments)
        timings.append((time.perf_counter() - start) / calls * 1e6)
    return timings[0], timings[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    source = assemble_source({"get_book": GET, "borrow_book": BORROW})
    trusted = [
        EnvTool("get_book", "", DOCS[0]["parameters"], get_book),
        EnvTool("borrow_book", "", DOCS[1]["parameters"], borrow_book, writes=True),
    ]
    print("| books | tool | (a) in process µs | (b) sandbox, reused µs | (c) sandbox, fresh µs | b/a | c/a |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    with SandboxExecutor() as reused, SandboxExecutor(calls_per_worker=1) as fresh:
        for books in (10, 1000):
            state = _state(books)
            rows = [
                _per_call_us(Pack(PackInfo("a"), trusted, state), args.calls),
                _per_call_us(Pack(PackInfo("b"), built_tools(DOCS, source, reused), state), args.calls),
                _per_call_us(
                    Pack(PackInfo("c"), built_tools(DOCS, source, fresh), state), max(5, args.calls // 10)
                ),
            ]
            for index, tool in enumerate(("get_book", "borrow_book")):
                a, b, c = (row[index] for row in rows)
                print(f"| {books} | {tool} | {a:.1f} | {b:.0f} | {c:.0f} | {b / a:.0f}× | {c / a:.0f}× |")


if __name__ == "__main__":
    main()
