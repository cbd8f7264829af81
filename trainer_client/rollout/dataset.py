"""Tasks from a veRL-format dataset (parquet rows with ``prompt``, ``reward_model``, ...).

``python -m tools.data build`` writes such files; the rollout CLI and the GRPO trainer
both read them here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_client.shared import plain

if TYPE_CHECKING:
    from trainer_client.rollout.types import Task


class DatasetError(ValueError):
    """A dataset that is missing or not in veRL's format; the message says which and why."""


@dataclass
class TaskRow:
    """One prompt from a veRL-format dataset, with its place in the file."""

    index: int
    data_source: str | None
    messages: list[dict[str, Any]]
    ground_truth: Any
    extra_info: dict[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[str, Any], index: int = 0, data_source: str | None = None) -> TaskRow:
        """A dataset row (numpy values and all); ``data_source`` is the default for the column."""
        row = plain(row)
        messages = row.get("prompt")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise DatasetError(
                f"row {index}: 'prompt' must be a list of chat messages, got {str(messages)[:200]}"
            )
        reward_model = row.get("reward_model") or {}
        return cls(
            index=index,
            data_source=row.get("data_source") or data_source,
            messages=[drop_nulls(m) for m in messages],
            ground_truth=reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            extra_info=_extra_info(row.get("extra_info")),
        )

    def task(self) -> Task:
        """A rollout ``Task``: ``extra_info`` may name a ``verifier``, ``tools`` (MCP
        descriptors or chat-template schemas; the task gets the latter), the user's later
        ``turns`` of a multi-turn conversation with the ``new_tools`` each of them makes
        available (MCP descriptors, one list per turn), and ``user_sim.scenario``, the
        scenario of a simulated user; all of it lands in ``metadata``."""
        from trainer_client.rollout.types import Task  # lazily: the CLI starts without the rollout core
        from trainer_client.rollout.user_sim import scenario_of
        from trainer_client.templates.render import openai_tool_schemas

        tools = self.extra_info.get("tools")
        user_turns = _user_turns(self.extra_info.get("turns"))
        return Task(
            messages=[dict(m) for m in self.messages],
            ground_truth=self.ground_truth,
            tools=openai_tool_schemas(tools) if isinstance(tools, list) and tools else None,
            verifier=self.extra_info.get("verifier"),
            metadata={"data_source": self.data_source, **self.extra_info},
            user_turns=user_turns,
            user_scenario=scenario_of(self.extra_info),
            new_tools=[
                openai_tool_schemas(turn) for turn in _new_tools(self.extra_info.get("new_tools"), user_turns)
            ],
        )


def drop_nulls(value: Any) -> Any:
    """``value`` without the None entries of its (nested) mappings.

    Parquet stores a column of nested dicts as one struct type, so every dict comes back
    with every key any row had: a message gets ``tool_calls=None``, a tool-call's
    arguments or a tool's ``inputSchema`` get the *other* tools' parameters as None. A
    None in a prompt or a schema is never what the author wrote there, so all are dropped.
    """
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def _extra_info(value: Any) -> dict[str, Any]:
    info = dict(value or {})
    for key in ("tools", "turns", "new_tools"):
        if isinstance(info.get(key), list):
            info[key] = drop_nulls(info[key])
    return info


def _user_turns(value: Any) -> list[list[dict[str, Any]]]:
    """``extra_info["turns"]``: the user's later turns, each a list of chat messages."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(turn, list) and all(isinstance(m, dict) for m in turn) for turn in value
    ):
        raise DatasetError(
            f"extra_info 'turns' must be a list of turns, each a list of messages: {str(value)[:200]}"
        )
    return [[dict(m) for m in turn] for turn in value]


def _new_tools(value: Any, turns: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """``extra_info["new_tools"]``: per later user turn, the tools it makes available."""
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > len(turns)
        or not all(isinstance(turn, list) and all(isinstance(t, dict) for t in turn) for turn in value)
    ):
        raise DatasetError(
            f"extra_info 'new_tools' must be a list (one per later turn, {len(turns)} here) of lists of "
            f"tool descriptors: {str(value)[:200]}"
        )
    return [[dict(t) for t in turn] for turn in value]


def load_tasks(path: str | os.PathLike[str], *, limit: int | None = None, offset: int = 0) -> list[TaskRow]:
    """Rows ``offset`` to ``offset + limit`` of a veRL-format parquet file."""
    import pandas as pd

    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetError(f"dataset {path} not found (build one with: python -m tools.data build --out DIR)")
    frame = pd.read_parquet(path)
    if "prompt" not in frame.columns:
        raise DatasetError(
            f"{path} has no 'prompt' column; expected veRL RL-dataset parquet, got {list(frame.columns)}"
        )
    end = len(frame) if limit is None else min(len(frame), offset + limit)
    try:
        return [TaskRow.from_row(frame.iloc[i].to_dict(), i, path.stem) for i in range(offset, end)]
    except DatasetError as exc:
        raise DatasetError(f"{path} {exc}") from None
