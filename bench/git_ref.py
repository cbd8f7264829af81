"""A git ref's copy of some top-level packages, for benches that compare a tree with a ref."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

__all__ = ["export_ref"]

REPO = Path(__file__).resolve().parents[1]


def export_ref(ref: str, *paths: str) -> str:
    """Extract ``paths`` (e.g. "tools", "protocol") as they are at ``ref`` into a new temporary
    directory and return it: put it first on ``sys.path`` to import the ref's code."""
    where = tempfile.mkdtemp(prefix="bench-ref-")
    data = subprocess.run(["git", "archive", ref, *paths], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(where, filter="data")
    return where
