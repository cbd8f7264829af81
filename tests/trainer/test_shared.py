"""The helpers the CLI, the GRPO trainer and the veRL plug-ins share."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from tests.support.require import require
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.dataset import DatasetError, TaskRow
from trainer_client.shared import LoopClients, plain


def test_plain_turns_numpy_and_omegaconf_values_into_json_data() -> None:
    row = {"a": np.array([1, 2]), "b": (np.int64(3), {"c": np.float32(0.5)}), 4: "x"}
    assert plain(row) == {"a": [1, 2], "b": [3, {"c": 0.5}], "4": "x"}
    omegaconf = require("omegaconf")
    config = omegaconf.OmegaConf.create({"urls": ["http://a"], "args": {"k": 1}})
    assert plain(config) == {"urls": ["http://a"], "args": {"k": 1}}


async def test_loop_clients_share_one_client_per_key_and_replace_a_closed_one() -> None:
    clients = LoopClients()
    first = clients.get("k", lambda: ToolClient("http://127.0.0.1:9", health_interval_s=0))
    assert clients.get("k", lambda: pytest.fail("made a second client")) is first
    await first.aclose()
    assert first.closed
    second = clients.get("k", lambda: ToolClient("http://127.0.0.1:9", health_interval_s=0))
    assert second is not first and not second.closed
    await clients.aclose()
    assert second.closed


def test_loop_clients_give_each_event_loop_its_own_client() -> None:
    clients = LoopClients()

    async def one() -> ToolClient:
        client = clients.get("k", lambda: ToolClient("http://127.0.0.1:9", health_interval_s=0))
        await clients.aclose()
        return client

    assert asyncio.run(one()) is not asyncio.run(one())


def test_a_dataset_row_becomes_a_task() -> None:
    row = {
        "prompt": np.array([{"role": "user", "content": "2+2?", "tool_calls": None}]),
        "reward_model": {"ground_truth": np.int64(4)},
        "extra_info": {"verifier": "math_equal", "kind": "add"},
    }
    task = TaskRow.from_row(row, 7, "arith").task()
    assert task.messages == [{"role": "user", "content": "2+2?"}]
    assert task.ground_truth == 4 and task.verifier == "math_equal"
    assert task.metadata == {"data_source": "arith", "verifier": "math_equal", "kind": "add"}
    with pytest.raises(DatasetError, match="prompt"):
        TaskRow.from_row({"prompt": "not messages"})


async def test_the_agent_loop_rereads_tool_schemas_after_their_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    require("verl")
    from trainer_client.verl import agent_loop as verl_agent_loop

    class Server:
        tools: list[dict[str, Any]] = [{"name": "a", "inputSchema": {"type": "object"}}]
        reads = 0

        async def list_tools(self, toolset: str | None = None) -> list[dict[str, Any]]:
            self.reads += 1
            return list(self.tools)

    server = Server()
    monkeypatch.setattr(verl_agent_loop, "_TOOL_SCHEMAS", {})
    read = verl_agent_loop.server_tool_schemas
    first = await read(server, ("http://x",), "t")  # type: ignore[arg-type]
    assert await read(server, ("http://x",), "t") == first and server.reads == 1  # type: ignore[arg-type]
    server.tools = [{"name": "b", "inputSchema": {"type": "object"}}]
    monkeypatch.setattr(verl_agent_loop, "TOOL_SCHEMAS_TTL_S", 0.0)
    again = await read(server, ("http://x",), "t")  # type: ignore[arg-type]
    assert server.reads == 2 and again != first
