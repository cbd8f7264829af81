"""How the veRL agent loop reads the row veRL hands it: the same way every dataset row is
read, so an environment task's pack, task and tool schemas reach the rollout."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tests.support.require import require

require("verl")
require("fastapi")  # veRL's agent loop imports it without declaring it

from trainer_client.verl.agent_loop import ToolFactoryAgentLoop  # noqa: E402
from trainer_client.verl.config import LoopSettings  # noqa: E402

LOOKUP = {
    "name": "lookup",
    "description": "Look a key up.",
    "inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}


def verl_row(extra_info: dict[str, Any]) -> dict[str, Any]:
    """A row as veRL's dataset gives it: numpy arrays of objects, as parquet reads them."""
    return {
        "raw_prompt": np.array([{"role": "user", "content": "Find k1.", "tool_calls": None}], dtype=object),
        "reward_model": {"ground_truth": {"pack": "shop", "task": "t-3"}},
        "extra_info": extra_info,
        "data_source": "env/shop",
        "index": np.int64(3),
    }


def task_for(settings: LoopSettings, row: dict[str, Any]) -> Any:
    return asyncio.run(ToolFactoryAgentLoop._task(None, settings, None, row))  # type: ignore[arg-type]


def test_an_environment_rows_pack_task_and_tools_reach_the_task() -> None:
    # parquet adds the other tools' parameters as None: they must not reach the template
    stored = {
        **LOOKUP,
        "inputSchema": {**LOOKUP["inputSchema"], "properties": {"key": {"type": "string"}, "sku": None}},
    }
    task = task_for(
        LoopSettings(server_urls=("http://127.0.0.1:1",)),
        verl_row({"pack": "shop", "task": "t-3", "level": 2, "tools": [stored]}),
    )
    assert task.messages == [{"role": "user", "content": "Find k1."}]
    assert (task.metadata["pack"], task.metadata["task"], task.metadata["level"]) == ("shop", "t-3", 2)
    assert task.metadata["index"] == 3 and task.metadata["data_source"] == "env/shop"
    assert task.ground_truth == {"pack": "shop", "task": "t-3"}
    assert task.tools == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a key up.",
                "parameters": LOOKUP["inputSchema"],
            },
        }
    ]


def test_the_loops_own_tool_settings_win_over_the_row() -> None:
    row = verl_row({"tools": [LOOKUP]})
    assert task_for(LoopSettings(server_urls=("http://x:1",), tools=[]), row).tools == []
    other = {**LOOKUP, "name": "other"}
    task = task_for(LoopSettings(server_urls=("http://x:1",), tools=[other]), row)
    assert [t["function"]["name"] for t in task.tools] == ["other"]
