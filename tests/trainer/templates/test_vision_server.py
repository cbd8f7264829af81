"""End to end: the image environment's views reach a rollout as image tokens.

A real tool server serves ``tools.envs.image_env:pack``; the rollout core (tiny Qwen2-VL
processor from ``tests/support/tiny_vlm.py``, scripted turns playing a task's gold calls,
the batched ``ToolClient``) binds the session to the task, gets PNG views through
``/v1/calls``, splices each as image tokens under mask 0, and is scored by the server's
``tool_use`` verifier, which reads the session's world: the gold trajectory earns 1.0
(eval mode) although the verify request carried no pixels.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from protocol.images import image_info
from tests.support.require import require
from tests.support.server import running_server, server_config
from tests.support.tiny_vlm import tiny_processor
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task
from trainer_client.templates.render import openai_tool_schemas

require("PIL", reason="Pillow is needed for images (pip install -e '.[images]')")

pytestmark = pytest.mark.timeout(180)
ARGS = {"seed": 5, "tasks": 6}


def test_gold_calls_show_views_as_image_tokens_and_score_one(smol_tokenizer: Any) -> None:
    from tools.envs.image_env import VIEW_SIDE, pack

    built = pack(**ARGS)
    task = next(t for t in built.tasks if t.metadata["level"] == 3)  # a zoom, then a rotate
    processor = tiny_processor(smol_tokenizer)
    tok = processor.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(text: str) -> ScriptedTurn:
        return ScriptedTurn(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids + [im_end])

    calls = [("view_image", {})] + [(c.name, c.arguments) for c in task.gold.calls]
    turns = [turn(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>") for n, a in calls]
    turns.append(turn(f"<answer>{task.gold.answer}</answer>"))
    generator = ScriptedGenerator(turns, eos_token_ids=[im_end])
    config = RolloutConfig(
        max_turns=len(turns),
        max_obs_tokens=2048,
        response_length=16384,
        verifier="tool_use",
        verifier_arguments={"mode": "eval"},
    )
    served = server_config(environments=[{"source": "tools.envs.image_env:pack", "arguments": ARGS}])

    async def run(url: str) -> Any:
        async with ToolClient(url) as client:
            tools = openai_tool_schemas(await client.list_tools(built.id))
            core = RolloutCore(tok, generator, client, config, verifier=client, processor=processor)
            truth = {"pack": built.id, "task": task.id}  # as the rows of tools.data build hold it
            return await core.run(
                Task(list(task.prompt), ground_truth=truth, tools=tools, metadata=dict(truth))
            )

    with running_server(served) as server:
        tr = asyncio.run(run(server.url))
    assert tr.error is None, tr.error
    assert tr.stop_reason == StopReason.ANSWER
    views = [m for m in tr.messages if m["role"] == "tool"]
    assert len(views) == len(calls) and all(isinstance(m["content"], list) for m in views)
    assert len(tr.images) == len(calls) == tr.metrics["images"]
    blocks = [b for m in views for b in m["content"] if b["type"] == "image"]
    sizes = [(i.width, i.height) for i in (image_info(b["data"], b["mimeType"]) for b in blocks)]
    assert [image.size for image in tr.images] == sizes and max(sizes[0]) == VIEW_SIDE
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    pads = [m for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if t == pad]
    assert len(pads) == tr.metrics["image_tokens"] > 0 and set(pads) == {0}
    assert all(c.image_data is not None for c in generator.calls_for(tr.session_id)[1:])
    assert tr.reward_score == 1.0, tr.metrics.get("verify_error")
    assert tr.reward_components["state"] == 1.0
