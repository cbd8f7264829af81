"""The current-figures table of bench/README.md, written from the scripts' results (bench/results/*.json).

    .venv/bin/python bench/figures.py           # rewrite the table between its markers
    .venv/bin/python bench/figures.py --check   # exit 1 when the README's table is not the results'

Each row keeps the figure's conditions and the run's date and load beside it.
tests/test_bench_layout.py runs ``--check``, so a hand edit of the table or a new results file
without the table regenerated fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent / "README.md"
BEGIN = "<!-- figures: written by bench/figures.py from bench/results/*.json; do not edit by hand -->"
END = "<!-- figures: end -->"


def table(results: Path = RESULTS) -> str:
    rows = ["| what | figure | ratio | conditions | run | section |", "|---|---|---|---|---|---|"]
    for path in sorted(
        results.glob("*.json"), key=lambda p: (json.loads(p.read_text()).get("order", 99), p.name)
    ):
        data = json.loads(path.read_text())
        run = f"`{data['command']}`, {data['date']}, load {data['load_average']}"
        for f in data["figures"]:
            cells = (f["what"], f["figure"], f["ratio"] or "—", f["conditions"], run, f["section"])
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def rendered(readme: str, results: Path = RESULTS) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"bench/README.md lacks the figures markers ({BEGIN!r} ... {END!r})")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(results)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when they differ")
    args = parser.parse_args(argv)
    current = README.read_text()
    wanted = rendered(current)
    if args.check:
        if wanted != current:
            print(
                "bench/README.md's figures table is not bench/results/*.json's: run bench/figures.py",
                file=sys.stderr,
            )
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
