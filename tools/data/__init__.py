"""Task data builders: veRL-format parquet for the search QA and calculator tasks.

``python -m tools.data build --out DIR --seed N`` writes ``DIR/<task>/{train,test}.parquet``.
Rows have the columns veRL's RL dataset reads: ``data_source``, ``prompt`` (chat messages),
``ability``, ``reward_model`` = ``{"style": "rule", "ground_truth": ...}`` and
``extra_info`` = ``{"split", "index", ...}``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.data import arithmetic, search_qa

COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
BUILDERS: dict[str, Callable[..., dict[str, list[dict[str, Any]]]]] = {
    "search_qa": search_qa.build_rows,
    "arithmetic": arithmetic.build_rows,
}


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write rows as one parquet file (pandas + pyarrow), creating the folder."""
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame.to_parquet(path, index=False)
    return path


__all__ = ["BUILDERS", "COLUMNS", "arithmetic", "search_qa", "write_parquet"]
