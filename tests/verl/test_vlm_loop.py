"""The veRL agent loop with a vision processor, against a real image-environment server.

``ToolFactoryAgentLoop.run`` is called as veRL calls it (a dataset row's fields as keyword
arguments), with the attributes veRL's ``AgentLoopBase`` would have set: the tiny Qwen2-VL
processor (``tests/support/tiny_vlm.py``), ``data.mm_processor_kwargs`` with a smaller
``max_pixels``, and the scripted generator as the server manager, playing a task's gold
calls. The output carries the views as ``multi_modal_data["images"]`` with the processor
kwargs, every image token under mask 0, the server's reward, and veRL's own post-processing
of it gives one grid per view that matches the pads (counted with the same ``max_pixels``).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from tests.support.require import require

require("verl")
require("fastapi")  # veRL's agent loop imports it without declaring it
require("PIL")
torch = require("torch")

from tests.support.server import running_server, server_config  # noqa: E402
from tests.support.tiny_vlm import MERGE, tiny_processor  # noqa: E402
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn  # noqa: E402
from trainer_client.verl.agent_loop import ToolFactoryAgentLoop  # noqa: E402
from trainer_client.verl.config import LoopSettings  # noqa: E402

pytestmark = pytest.mark.timeout(180)
ARGS = {"seed": 9, "tasks": 3}
MAX_PIXELS = 32 * 28 * 28  # below the tiny processor's own 64: the loop's kwargs must reach every call
# Both bounds: transformers 5's Qwen2-VL image processor ignores one given alone.
MM_KWARGS = {"min_pixels": 4 * 28 * 28, "max_pixels": MAX_PIXELS}


def test_the_loop_returns_views_as_multi_modal_data() -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from tools.envs.image_env import pack
    from trainer_client.backends.models import load_tokenizer

    built = pack(**ARGS)
    task = next(t for t in built.tasks if t.metadata["level"] == 2)  # two zooms
    processor = tiny_processor(load_tokenizer("smollm2"))
    tok = processor.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(text: str) -> ScriptedTurn:
        return ScriptedTurn(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids + [im_end])

    calls = [(c.name, c.arguments) for c in task.gold.calls]
    turns = [turn(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>") for n, a in calls]
    turns.append(turn(f"<answer>{task.gold.answer}</answer>"))

    served = server_config(environments=[{"source": "tools.envs.image_env:pack", "arguments": ARGS}])
    with running_server(served) as server:
        descriptors = httpx.get(f"{server.url}/v1/tools", params={"toolset": built.id}, timeout=30).json()[
            "tools"
        ]
        loop = object.__new__(ToolFactoryAgentLoop)  # the attributes veRL's AgentLoopBase sets
        loop.tokenizer, loop.processor = tok, processor
        loop.server_manager = ScriptedGenerator(turns, eos_token_ids=[im_end])
        loop.mm_processor_kwargs = dict(MM_KWARGS)
        loop.prompt_length, loop.response_length = 4096, 4096
        loop.settings = LoopSettings(
            server_urls=(server.url,),
            toolset=built.id,
            max_turns=len(turns),
            max_obs_tokens=1024,
            verifier="tool_use",
            verifier_arguments={"mode": "eval"},
        )
        truth = {"pack": built.id, "task": task.id}
        output = asyncio.run(
            loop.run(
                {"temperature": 1.0, "logprobs": True},
                raw_prompt=list(task.prompt),
                reward_model={"ground_truth": truth},
                extra_info={**truth, "tools": descriptors},
                index=0,
            )
        )
    fields = output.extra_fields["toolfactory"]
    assert fields["error"] is None and fields["stop_reason"] == "answer"
    assert output.reward_score == 1.0
    images = output.multi_modal_data["images"]
    assert len(images) == len(calls) == fields["tool_calls"]
    assert output.mm_processor_kwargs == MM_KWARGS
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    pads = [m for t, m in zip(output.response_ids, output.response_mask, strict=True) if t == pad]
    assert pads and set(pads) == {0} and len(pads) <= len(images) * MAX_PIXELS // (28 * 28)
    assert loop._vision_processor() is processor
    # veRL's post-processing (with the output's processor kwargs): one grid per view, as many
    # merged patches as pads.
    ids = torch.tensor([output.prompt_ids + output.response_ids])
    worker = SimpleNamespace(processor=processor, tokenizer=tok)
    inputs = AgentLoopWorker._compute_multi_modal_inputs(worker, output, ids)
    grid = inputs["image_grid_thw"]
    assert grid.shape == (len(images), 3)
    assert int(grid.prod(dim=-1).sum()) // MERGE**2 == len(pads)
