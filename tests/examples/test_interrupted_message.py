"""The examples' Ctrl-C message names metrics.jsonl only once a step wrote it (it did before the first)."""

from __future__ import annotations

from pathlib import Path

from examples._run import interrupted_message


def test_the_message_names_metrics_only_when_a_step_finished(tmp_path: Path) -> None:
    assert (
        interrupted_message(tmp_path)
        == "interrupted before the first training step finished: nothing was written"
    )
    assert interrupted_message(None).startswith("interrupted before the first training step")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert (
        interrupted_message(tmp_path)
        == f"interrupted: the steps that finished are in {tmp_path / 'metrics.jsonl'}"
    )
