"""Training runs under the runs directory: each directory with a ``metrics.jsonl`` or TensorBoard event files.

The trainer writes one JSON record per line with ``split`` (train, eval, eval_greedy) and
``step`` and numbers (``reward``, ``success``, ``success/<kind>``, ...); the workbench
plots them. Read as plain JSON: the tool server never imports the trainer client.
veRL runs (and the trainer with ``--tensorboard``) write TensorBoard event files: their
tags are listed with each run and one tag's curve is read on request
(``tool_server.workbench.tensorboard``). Event files in a ``tensorboard`` folder beside a
``metrics.jsonl`` (where the trainer puts them) belong to that run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tool_server.workbench.tensorboard import EVENT_FILE_MARK, ScalarReader

__all__ = ["RunFiles", "find_runs", "read_runs"]

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
MAX_RUNS = 200


@dataclass
class RunFiles:
    metrics: Path | None = None
    events: list[Path] = field(default_factory=list)
    mtime: float = 0.0


def find_runs(runs_dir: Path) -> dict[str, RunFiles]:
    """Every run under ``runs_dir`` by name (its directory, relative), newest first."""
    found: dict[Path, RunFiles] = {}
    for root, dirs, names in os.walk(runs_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(root)
        events = sorted(here / n for n in names if EVENT_FILE_MARK in n)
        if METRICS_FILE in names:
            found.setdefault(here, RunFiles()).metrics = here / METRICS_FILE
        if events:
            beside = here.name == TENSORBOARD_DIR and (here.parent / METRICS_FILE).is_file()
            found.setdefault(here.parent if beside else here, RunFiles()).events += events
    for run in found.values():
        paths = [*run.events, *([run.metrics] if run.metrics else [])]
        run.mtime = max(p.stat().st_mtime for p in paths)
    ordered = sorted(found.items(), key=lambda item: item[1].mtime, reverse=True)[:MAX_RUNS]
    return {str(path.relative_to(runs_dir)) or ".": run for path, run in ordered}


def read_runs(runs_dir: Path, reader: ScalarReader) -> list[dict[str, Any]]:
    """``[{"name", "records": [{split, step, numbers...}], "tensorboard": {tags...}}]``, newest run first."""
    runs = []
    for name, files in find_runs(runs_dir).items():
        run: dict[str, Any] = {"name": name, "records": [], "unreadable_lines": 0}
        if files.metrics is not None:
            run["records"], run["unreadable_lines"] = _records(files.metrics)
        if files.events:
            run["tensorboard"] = reader.tags(files.events)
        runs.append(run)
    return runs


def _records(path: Path) -> tuple[list[dict[str, Any]], int]:
    records, bad = [], 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad += 1  # a line still being written, or damaged: skipped, counted
                continue
            if isinstance(record, dict) and "step" in record:
                records.append(
                    {k: v for k, v in record.items() if k in ("split", "step") or isinstance(v, int | float)}
                )
    return records, bad
