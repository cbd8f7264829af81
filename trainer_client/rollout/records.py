"""Trajectories as JSON records: one line of a ``trainer-client rollout`` output JSONL each.

``trajectory_record`` writes a ``rollout.Trajectory`` (with its dataset row) as a dict;
``read_records`` reads a file of them back (``show``, ``summary``, the workbench).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from trainer_client.rollout.dataset import TaskRow
from trainer_client.shared import CliError

__all__ = ["read_records", "segments", "trajectory_record"]


def segments(
    ids: Sequence[int], mask: Sequence[int], decode: Callable[[list[int]], str]
) -> list[dict[str, Any]]:
    """Runs of model tokens (mask 1) and observation tokens (mask 0), decoded."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append({"model": bool(mask[start]), "text": decode(list(ids[start:i]))})
            start = i
    return out


def trajectory_record(
    trajectory: Any, row: TaskRow, sample: int, decode: Callable[[list[int]], str]
) -> dict[str, Any]:
    """A ``rollout.Trajectory`` as one JSON-able dict (one line of the output JSONL).

    Images are in ``messages`` (docs/images.md, "Images in trajectories"); in ``segments``
    a run of one image's pad tokens is written once with its count."""
    if getattr(trajectory, "images", None):
        decode = _collapsing(decode)
    return {
        "id": trajectory.session_id,
        "index": row.index,
        "sample": sample,
        "data_source": row.data_source,
        "ground_truth": row.ground_truth,
        "reward": trajectory.reward_score,
        "reward_components": trajectory.reward_components,
        "reward_details": trajectory.reward_details,
        "final_answer": trajectory.final_answer,
        "stop_reason": str(trajectory.stop_reason),
        "num_turns": trajectory.num_turns,
        "error": trajectory.error,
        "metrics": trajectory.metrics,
        "messages": trajectory.messages,
        "calls": trajectory.calls,
        "num_prompt_messages": len(row.messages),
        "segments": segments(trajectory.response_ids, trajectory.response_mask, decode),
        "prompt_ids": trajectory.prompt_ids,
        "response_ids": trajectory.response_ids,
        "response_mask": trajectory.response_mask,
        "response_logprobs": trajectory.response_logprobs,
    }


_TOKEN_RUN = re.compile(r"(<\|?[A-Za-z_]+\|?>)\1+")


def _collapsing(decode: Callable[[list[int]], str]) -> Callable[[list[int]], str]:
    """``decode`` with runs of one special token (an image's pads) as ``<|image_pad|>×N``."""

    def collapsed(ids: list[int]) -> str:
        return _TOKEN_RUN.sub(lambda m: f"{m[1]}×{len(m[0]) // len(m[1])}", decode(ids))

    return collapsed


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(Path(path).expanduser(), "rb") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise CliError(f"{path}:{number} is not valid JSON: {exc}") from None
