"""Where a benchmark leaves its headline figures: ``bench/results/<name>.json``, with their conditions.

``record(name, script, command, figures)`` writes one file per source of figures (replacing the
previous run's); the date, the machine's load average and the commit are filled in. Each figure
carries its own ``conditions`` (what ran against what: dtypes, caching, quiet or loaded), which
the current-figures table in bench/README.md prints beside it (``bench/figures.py`` writes that
table from these files: a figure whose conditions are dropped reads as a different claim, e.g.
"vLLM 18.8x HF" was bf16 with prefix caching against fp32 HF, where a plain decode gives 1.5-4x).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

__all__ = ["RESULTS", "Figure", "record"]

RESULTS = Path(__file__).resolve().parent / "results"
Figure = dict[str, str]  # what, figure, ratio ("" when none), conditions, section
FIELDS = ("what", "figure", "ratio", "conditions", "section")


def record(
    name: str, script: str, command: str, figures: list[Figure], *, load: str | None = None, order: int = 99
) -> Path:
    """Write ``bench/results/<name>.json`` and return its path."""
    for figure in figures:
        missing = [f for f in FIELDS if f not in figure]
        if missing:
            raise ValueError(
                f"figure {figure.get('what')!r} lacks {missing}: every figure keeps its conditions"
            )
    if load is None:
        load = f"{os.getloadavg()[0]:.1f}"
    data = {
        "order": order,  # the row's place in the table
        "script": script,
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": load,
        "commit": _commit(),
        "figures": figures,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return path


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "?"
