"""Tool-call parsers on adversarial model output: this working tree against a git ref.

Early in RL a model writes anything: thousands of ``<tool_call>`` openers, an ``<answer>``
tag repeated, a fence of whitespace. A parser that re-scans the rest of the text per opener
is quadratic, and one rollout turn can then hold a CPU for minutes. For each input kind and
size, two processes (this tree's ``trainer_client.parsers.registry`` and ``git archive REF``'s) parse
the same text; printed: seconds per parse on each side, their ratio, and how the time grows
when the input doubles (2 for linear, 4 for quadratic).

    .venv/bin/python bench/client/parsers.py --ref 0d9220c~1            # sizes 8k-64k, ~1 min
    .venv/bin/python bench/client/parsers.py --ref 0d9220c~1 --sizes 1000000 --tree-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Each input: a format and a piece repeated up to the size (characters).
INPUTS = {
    "answer openers (hermes)": ("hermes", "<answer>"),
    "tool_call openers (hermes)": ("hermes", "<tool_call>"),
    "good calls (hermes)": ("hermes", '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>\n'),
    "fence of spaces (hermes)": ("hermes", "```json" + " " * 64),
    "objects (llama3_json)": ("llama3_json", '{"name": "calc", "parameters": {"x": [1, 2]}} '),
    "search openers (search_r1)": ("search_r1", "<search>"),
}


def measure(sizes: list[int], budget_s: float) -> dict[str, dict[str, float | None]]:
    """Seconds per parse for every input and size, in this process (None: over the budget)."""
    from trainer_client.parsers.registry import get_parser

    out: dict[str, dict[str, float | None]] = {}
    for name, (fmt, piece) in INPUTS.items():
        parser = get_parser(fmt)
        out[name] = {}
        over = False
        for size in sizes:
            if over:  # the smaller size already took too long: the larger would take longer
                out[name][str(size)] = None
                continue
            text = (piece * (size // len(piece) + 1))[:size]
            runs, start = 0, time.perf_counter()
            while True:
                parser.parse(text)
                runs += 1
                elapsed = time.perf_counter() - start
                if elapsed > 0.2 or runs >= 50:
                    break
            out[name][str(size)] = elapsed / runs
            over = elapsed / runs > budget_s
    return out


def side(root: str, sizes: list[int], budget_s: float) -> dict[str, dict[str, float | None]]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]);"
        "from bench.client.parsers import measure;"
        "print(json.dumps(measure(json.loads(sys.argv[3]), float(sys.argv[4]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, root, str(REPO), json.dumps(sizes), str(budget_s)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    return json.loads(done.stdout)


def seconds(value: float | None) -> str:
    if value is None:
        return "skipped"
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the git ref to compare with (e.g. before a change)")
    parser.add_argument(
        "--sizes", default="8000,16000,32000,64000", help="input sizes in characters, comma-separated"
    )
    parser.add_argument(
        "--budget-s", type=float, default=5.0, help="a side skips larger sizes once one parse takes longer"
    )
    parser.add_argument("--tree-only", action="store_true", help="measure this tree only (no ref side)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tree = side(str(REPO), sizes, args.budget_s)
    sys.path.insert(0, str(REPO))
    from bench.git_ref import export_ref  # noqa: PLC0415 (this process only: the sides import their own trees)

    ref = (
        None
        if args.tree_only
        else side(export_ref(args.ref, "trainer_client", "protocol"), sizes, args.budget_s)
    )
    print(f"| input | size | tree | {'' if ref is None else 'ref | ref / tree |'} tree growth x2 |")
    print(f"|---|---:|---:|{'' if ref is None else '---:|---:|'}---:|")
    for name in INPUTS:
        previous = None
        for size in sizes:
            now = tree[name][str(size)]
            growth = f"{now / previous:.1f}" if now and previous else ""
            cells = [name, f"{size:,}", seconds(now)]
            if ref is not None:
                then = ref[name][str(size)]
                ratio = then / now if then and now else None
                cells += [
                    seconds(then),
                    "" if ratio is None else f"{ratio:,.2g}x" if ratio < 10 else f"{ratio:,.0f}x",
                ]
            print("| " + " | ".join([*cells, growth]) + " |")
            previous = now


if __name__ == "__main__":
    main()
