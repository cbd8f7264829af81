"""Images in rollouts agree token for token with veRL 0.9.1's own VLM handling.

The rollout core (tiny Qwen2-VL stand-in from ``tests/support/tiny_vlm.py``, scripted
turns, tool results with text and images) is replayed through veRL's continuous-token
builder for a Qwen2-VL model with that processor (``QwenVLContinuousTokenBuilder``), the way
veRL's ``ToolAgentLoop`` drives it: ``build_initial_tokens``, ``merge_assistant_tokens``, and
``merge_context_tokens`` over tool messages whose image blocks are
``{"type": "image", "image": <PIL image>}`` (veRL's form; ours keep the MCP block, the
images are the same). Ids, masks and log-probs must be equal.

Then the plug-in's ``AgentLoopOutput`` goes through veRL's own post-processing
(``AgentLoopWorker._compute_multi_modal_inputs``: collapse the pad runs, decode, re-run the
processor on the text and ``multi_modal_data["images"]``), and the tiny model's forward
takes the resulting ``pixel_values`` and ``image_grid_thw`` with our ids: the shapes the
trainer sees line up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.require import require

require("verl")
require("fastapi")  # veRL's agent loop imports it without declaring it
require("PIL")
torch = require("torch")

from tests.support.tiny_vlm import ZOOM, ImageInvoker, png_block, tiny_model, tiny_processor  # noqa: E402
from tests.trainer.test_verl_agreement import verl_replay as text_replay  # noqa: E402
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn  # noqa: E402
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task, Trajectory  # noqa: E402
from trainer_client.templates.vision import decode_image, image_blocks, training_inputs  # noqa: E402
from trainer_client.verl.agent_loop import ToolFactoryAgentLoop  # noqa: E402
from trainer_client.verl.config import LoopSettings  # noqa: E402


@pytest.fixture(scope="module")
def processor() -> Any:
    from trainer_client.backends.models import load_tokenizer

    return tiny_processor(load_tokenizer("smollm2"))


@pytest.fixture(scope="module")
def builder(processor: Any) -> Any:
    from verl.utils.tokenizer.continuous_token import QwenVLContinuousTokenBuilder
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    built = create_continuous_token_builder(
        processor.tokenizer, hf_model_type="qwen2_vl", processor=processor
    )
    assert isinstance(built, QwenVLContinuousTokenBuilder)
    return built


def _ids(processor: Any, text: str) -> list[int]:
    return processor.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def rollout(
    processor: Any, invoker: ImageInvoker, calls: list[list[str]]
) -> tuple[Trajectory, ScriptedGenerator]:
    """One turn per entry of ``calls`` (parallel zoom calls), then an answer."""
    im_end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    texts = [
        "Looking.\n"
        + "\n".join(
            f"<tool_call>\n{json.dumps({'name': 'zoom', 'arguments': {'what': w}})}\n</tool_call>"
            for w in turn
        )
        for turn in calls
    ]
    turns = [ScriptedTurn(_ids(processor, t) + [im_end]) for t in [*texts, "<answer>K7QX</answer>"]]
    generator = ScriptedGenerator(turns, eos_token_ids=[im_end])
    config = RolloutConfig(
        response_length=8192,
        max_obs_tokens=8192,
        max_turns=len(turns),
        parser_options={"parallel_calls": True},
    )
    core = RolloutCore(processor.tokenizer, generator, invoker, config, processor=processor)
    trajectory = asyncio.run(core.run(Task([{"role": "user", "content": "Read the label."}], tools=[ZOOM])))
    assert trajectory.error is None, trajectory.error
    assert trajectory.stop_reason == StopReason.ANSWER
    return trajectory, generator


def verl_form(message: dict[str, Any]) -> dict[str, Any]:
    """A tool message as veRL's ToolAgentLoop builds it: images as PIL objects."""
    if not image_blocks(message.get("content")):
        return message
    content = [
        {"type": "image", "image": decode_image(b)} if b["type"] == "image" else b for b in message["content"]
    ]
    return dict(message, content=content)


def verl_replay(
    builder: Any, tr: Trajectory, generator: ScriptedGenerator
) -> tuple[list[int], list[int], list[float]]:
    """The text replay of test_verl_agreement, on the messages in veRL's form."""
    return text_replay(
        builder, dataclasses.replace(tr, messages=[verl_form(m) for m in tr.messages]), generator
    )


@pytest.mark.parametrize(
    ("sizes", "calls"),
    [
        ([(200, 150)], [["a"]]),
        ([(64, 300), (500, 120)], [["a"], ["b", "c"]]),
    ],
)
def test_image_observations_agree_with_verls_vl_builder(
    processor: Any, builder: Any, sizes: list[tuple[int, int]], calls: list[list[str]]
) -> None:
    blocks = [png_block(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    tr, generator = rollout(processor, ImageInvoker({"zoom": blocks}), calls)
    n_images = len(blocks) * sum(len(turn) for turn in calls)
    assert len(tr.images) == n_images and tr.metrics["images"] == n_images
    ids, mask, logprobs = verl_replay(builder, tr, generator)
    assert ids == tr.response_ids
    assert mask == tr.response_mask
    assert logprobs == tr.response_logprobs


def test_verls_postprocessing_of_the_output_feeds_the_tiny_vlm(processor: Any) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    blocks = [png_block(150, 100, seed=11), png_block(80, 80, seed=12)]
    tr, _ = rollout(processor, ImageInvoker({"zoom": blocks}), [["a"], ["b"]])
    loop = object.__new__(
        ToolFactoryAgentLoop
    )  # veRL's constructor needs a trainer config; to_output does not
    loop.response_length = 8192
    loop.processor = processor
    loop.mm_processor_kwargs = {}
    output = loop.to_output(tr, LoopSettings(server_urls=("http://unused",)), want_logprobs=True)
    assert output.multi_modal_data == {"images": tr.images} and len(tr.images) == 4
    ids = torch.tensor([output.prompt_ids + output.response_ids])
    worker = SimpleNamespace(processor=processor, tokenizer=processor.tokenizer)
    inputs = AgentLoopWorker._compute_multi_modal_inputs(worker, output, ids)
    ours = training_inputs(processor, output.prompt_ids + output.response_ids, tr.images)
    assert torch.equal(inputs["image_grid_thw"], ours["image_grid_thw"])
    assert torch.equal(inputs["pixel_values"], ours["pixel_values"])
    model = tiny_model(processor)
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            mm_token_type_ids=ours["mm_token_type_ids"],
            pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
        ).logits
    assert logits.shape == (1, ids.shape[1], len(processor.tokenizer)) and torch.isfinite(logits).all()
