"""The workbench at scale: a 100k-line rollout file and 1,000 tools, in the server and in the browser.

Writes a synthetic trajectories JSONL (``--lines`` records in the shape ``trainer-client
rollout`` writes, with ``calls`` and ``reward_details``; ``--tokens`` response tokens each,
every 1,000th line ``--long-tokens``), then measures, side by side in one run:

1. the trajectory index in this process: the first filtered page (builds the line index:
   one pass over the file), a page turn and another filter (from the index), a page after
   appending 100 lines (only they are read), a trajectory and its GRPO group read back,
   the naive way (parse the whole file for every page), and the index's memory;
2. the pages in Debian's chromium (Playwright) against a real server with ``--tools``
   more tools and the file under its runs directory: Tools page load, filter and page turn;
   Trajectories page load (a fresh server: includes building the index), filter, page
   turn, and opening a long trajectory drawn token by token (the SmolLM2 tokenizer).

Usage: python bench/server/workbench.py [--lines 100000] [--tools 1000] [--quick] [--no-browser]
(``--quick``: 10,000 lines, 200 tools).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.support: a real server

from tool_server.workbench.files import TrajectoryIndex, summary_of  # noqa: E402

ID, INDEX = b"s-IDPLACEHOLDER", b"987654321"  # replaced per line (the index by a padded number)
SOURCES = ["toolfactory/arithmetic", "toolfactory/search_qa", "env/bank"]


def record(tokens: int, rng: random.Random) -> dict[str, Any]:
    """One trajectory; its id and prompt index are placeholders, its other fields drawn from ``rng``."""
    mask = [1 if (i // 200) % 3 else 0 for i in range(tokens)]
    errors = rng.choice([0, 0, 1])
    return {
        "id": ID.decode(),
        "index": int(INDEX),
        "sample": rng.randrange(8),
        "data_source": rng.choice(SOURCES),
        "ground_truth": "42",
        "reward": rng.choice([0.0, 0.0, 1.0]),
        "reward_components": {"math_equal": 1.0},
        "reward_details": {"answer": "42", "tagged": True, "golds": ["42"], "path": "number"},
        "final_answer": "42",
        "stop_reason": rng.choice(["answer", "eos", "max_turns"]),
        "num_turns": 4,
        "error": None,
        "metrics": {"calls": 2, "tool_errors": errors, "tool_s": 0.01, "generate_s": 1.2},
        "messages": [
            {"role": "user", "content": "x" * 400},
            {"role": "assistant", "content": "<tool_call>...</tool_call>"},
            {"role": "tool", "name": "calculator", "content": "42"},
            {"role": "assistant", "content": "<tool_call>...</tool_call>"},
            {"role": "tool", "name": "calculator", "content": "Error (tool_error): no" if errors else "7"},
        ],
        "calls": [
            {
                "turn": t,
                "message": 2 * t,
                "name": "calculator",
                "elapsed_ms": 0.2,
                "cached": t == 2,
                "error": None,
            }
            for t in (1, 2)
        ],
        "num_prompt_messages": 1,
        "segments": [{"model": True, "text": "y" * (4 * tokens)}],
        "prompt_ids": [rng.randrange(49152) for _ in range(200)],
        "response_ids": [rng.randrange(49152) for _ in range(tokens)],
        "response_mask": mask,
        "response_logprobs": [round(-rng.random(), 3) if m else 0.0 for m in mask],
    }


def write_file(path: Path, lines: int, tokens: int, long_tokens: int, start: int = 0) -> None:
    """``lines`` lines from 64 serialized templates (drawing 100k records would take minutes)."""
    rng = random.Random(start)
    short = [orjson.dumps(record(tokens, rng)) for _ in range(64)]
    long = [orjson.dumps(record(long_tokens, rng)) for _ in range(4)]
    with open(path, "ab") as handle:
        for n in range(start, start + lines):
            line = long[n % 4] if n % 1000 == 999 else short[n % 64]
            line = line.replace(ID, f"s-{n:013x}".encode()).replace(INDEX, f"{n // 8:>9}".encode())
            handle.write(line + b"\n")


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def in_process(path: Path, args: argparse.Namespace) -> dict[str, float]:
    index = TrajectoryIndex()
    filters = {"tool_errors": "yes", "data_source": "env/bank"}
    before = rss_mb()
    out = {"first": timed(lambda: index.page(path, filters, 0, 50))}
    out["index_mb"] = rss_mb() - before
    out["turn"] = min(timed(lambda k=k: index.page(path, filters, 50 * k, 50)) for k in range(1, 6))
    out["refilter"] = min(
        timed(lambda s=s: index.page(path, {"stop_reason": s}, 0, 50)) for s in ("eos", "answer")
    )
    out["open"] = min(
        timed(lambda n=n: (index.record(path, n), index.siblings(path, n)))
        for n in (5, 999, 50_001 % args.lines)
    )
    write_file(path, 100, args.tokens, args.long_tokens, start=args.lines)
    out["appended"] = timed(lambda: index.page(path, filters, 0, 50))

    def naive() -> None:
        with open(path, "rb") as handle:
            rows = [summary_of(orjson.loads(line)) for line in handle]
        [r for r in rows if r["tool_errors"] and r["data_source"] == "env/bank"][:50]

    out["naive"] = timed(naive)
    return out


def in_browser(runs: Path, args: argparse.Namespace) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    from tests.support.server import running_server, server_config
    from trainer_client.backends.models import resolve_model_path

    many = [
        {"target": "tools.testing:echo", "name": f"echo_{i:04d}", "toolsets": ["many"]}
        for i in range(args.tools)
    ]
    base = server_config()["tools"]
    total = len(base) + args.tools
    config = server_config(
        tools=[*base, *many],
        workbench={"runs_dir": str(runs), "tokenizer": str(resolve_model_path("smollm2"))},
    )
    chromium = os.environ.get("TOOLFACTORY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    out: dict[str, float] = {}
    with running_server(config) as srv, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(180_000)
        rss_before = rss_mb(srv.proc.pid)

        def step(name: str, act: Callable[[], Any], ready: str) -> None:
            print(f"  … {name}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            act()
            page.wait_for_selector(ready, state="attached")
            out[name] = time.perf_counter() - start

        step(
            "tools_load", lambda: page.goto(srv.url + "/ui/"), f".count:has-text('{total} of {total} tools')"
        )
        step(
            "tools_filter",
            lambda: page.fill("[data-filter]", f"echo_{args.tools - 1:04d}"),
            f".count:has-text('1 of {total} tools')",
        )
        page.fill("[data-filter]", "")
        page.wait_for_selector(f".count:has-text('{total} of {total} tools')")
        step("tools_turn", lambda: page.click("button:has-text('next')"), "text=page 2 of")
        lines = args.lines + 100
        step(
            "traj_load",
            lambda: page.goto(srv.url + "/ui/#/trajectories/big.jsonl"),
            f"[data-count]:has-text('{lines:,} of {lines:,}')",
        )
        out["server_index_mb"] = rss_mb(srv.proc.pid) - rss_before
        step(
            "traj_filter",
            lambda: page.select_option("select[aria-label='tool errors']", "yes"),
            f"[data-count]:not(:has-text('{lines:,} of'))",
        )
        step(
            "traj_turn", lambda: page.click(".pager button:has-text('next')"), ".pager:has-text('page 2 of')"
        )
        page.select_option("select[aria-label='tool errors']", "")  # the last line may have none
        page.wait_for_selector(f"[data-count]:has-text('{lines:,} of {lines:,}')")
        step(
            "traj_far",
            lambda: page.fill("input[aria-label='trajectory id']", f"s-{lines - 2:013x}"),
            "[data-count]:has-text('1 of')",
        )
        long_line = (args.lines // 1000) * 1000 - 1
        step(
            "traj_open_long",
            lambda: page.goto(f"{srv.url}/ui/#/trajectories/big.jsonl/{long_line}"),
            f"[data-trajectory] [data-line='{long_line}'] .tok[data-i='{args.long_tokens - 1}']",
        )
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=300, help="response tokens of most lines")
    parser.add_argument("--long-tokens", type=int, default=4096, help="response tokens of every 1,000th line")
    parser.add_argument("--tools", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="10,000 lines and 200 tools")
    parser.add_argument("--no-browser", action="store_true", help="only the in-process index figures")
    args = parser.parse_args()
    if args.quick:
        args.lines, args.tools = 10_000, 200
    args.lines = max(args.lines, 1000)  # at least one long trajectory
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.jsonl"
        made = timed(lambda: write_file(path, args.lines, args.tokens, args.long_tokens))
        size_mb = path.stat().st_size / 1e6
        print(
            f"{args.lines:,} trajectories ({args.tokens:,} tokens; every 1,000th {args.long_tokens:,}): {size_mb:,.0f} MB, written in {made:.1f} s"
        )
        print(f"load: {os.getloadavg()[0]:.1f} (1-minute average), {os.cpu_count()} CPUs")
        core = in_process(path, args)
        print("in process (TrajectoryIndex), ms:")
        print(
            f"  first page (builds the index)      {core['first'] * 1000:10.1f}  ({size_mb / core['first']:,.0f} MB/s)"
        )
        print(f"  index memory (RSS growth)          {core['index_mb']:10.1f} MB")
        print(f"  page turn (from the index)         {core['turn'] * 1000:10.2f}")
        print(f"  another filter (from the index)    {core['refilter'] * 1000:10.2f}")
        print(f"  one trajectory + its GRPO group    {core['open'] * 1000:10.2f}")
        print(f"  a page after 100 appended lines    {core['appended'] * 1000:10.1f}")
        print(
            f"  naive: parse the file per page     {core['naive'] * 1000:10.1f}  ({core['naive'] / core['turn']:,.0f}x a page turn)"
        )
        if args.no_browser:
            return
        shown = in_browser(Path(tmp), args)
        print(f"in chromium against a real server ({args.tools:,} more tools), ms:")
        for key, label in [
            ("tools_load", "Tools page load"),
            ("tools_filter", "Tools filter (one match)"),
            ("tools_turn", "Tools page turn"),
            ("traj_load", "Trajectories load (builds the index)"),
            ("traj_filter", "Trajectories filter"),
            ("traj_turn", "Trajectories page turn"),
            ("traj_far", "Trajectories: find the last id"),
            ("traj_open_long", f"open a {args.long_tokens:,}-token trajectory"),
        ]:
            print(f"  {label:<38} {shown[key] * 1000:10.1f}")
        print(f"  server memory growth, index built  {shown['server_index_mb']:10.1f} MB")
        print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
