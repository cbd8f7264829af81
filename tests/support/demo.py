"""The quick demo as the tests run it: ``python -m trainer_client.demo --quick``."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class QuickDemo:
    """What the demo printed and the directory it wrote (its server's log, rollout JSONL files)."""

    done: subprocess.CompletedProcess[str]
    out_dir: Path


def run_quick_demo(out_dir: Path) -> QuickDemo:
    done = subprocess.run(
        [sys.executable, "-m", "trainer_client.demo", "--quick", "--engine", "hf", "--out-dir", str(out_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    return QuickDemo(done, out_dir)
