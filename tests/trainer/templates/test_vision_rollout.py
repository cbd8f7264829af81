"""Images in rollouts: a tool result's image reaches the trajectory as image tokens under mask 0.

A tiny random-weight Qwen2-VL stand-in (``tests/support/tiny_vlm.py``: SmolLM2's tokenizer
with the vision tokens, Qwen2-VL's real processor, a one-layer model) and the scripted
generator drive the rollout core. What is checked: the spliced ids are the processor's
rendering of the whole conversation (each image expanded to its grid's pad tokens), with
mask 0 and log-prob 0; the images travel to the generator and out in ``Trajectory.images``;
the observation budget counts image tokens and replaces an image that does not fit with a
visible note; the response budget ends the trajectory before a partial image; a text-only
model sees a note instead of nothing; text-only trajectories keep their old form; the tiny
model's forward takes the trajectory's ids and pixels. End to end, the image environment's
views come from a real tool server.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import orjson
import pytest

from tests.support.require import require
from tests.support.tiny_vlm import ZOOM, ImageInvoker, png_block, tiny_model, tiny_processor
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.rollout.core import (
    TRUNCATION_MARKER,
    RolloutConfig,
    RolloutCore,
    StopReason,
    Task,
    Trajectory,
)
from trainer_client.rollout.dataset import TaskRow
from trainer_client.rollout.records import trajectory_record
from trainer_client.templates.vision import VisionChatRenderer, decode_image, training_inputs

require("PIL", reason="Pillow is needed for images (pip install -e '.[images]')")
torch = require("torch", reason="torch is needed for the tiny VLM")


@pytest.fixture(scope="module")
def processor(smol_tokenizer: Any) -> Any:
    return tiny_processor(smol_tokenizer)


def _ids(processor: Any, text: str) -> list[int]:
    return processor.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def _call(name: str, what: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': {'what': what}})}\n</tool_call>"


def roll(
    processor: Any,
    invoker: Any,
    turns: list[str],
    *,
    vision: bool = True,
    **config: Any,
) -> tuple[Trajectory, ScriptedGenerator]:
    tok = processor.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    generator = ScriptedGenerator(
        [ScriptedTurn(_ids(processor, t) + [im_end]) for t in turns], eos_token_ids=[im_end]
    )
    settings = {
        "response_length": 4096,
        "max_obs_tokens": 4096,
        "max_turns": len(turns),
        "verifier": "v",
        **config,
    }
    core = RolloutCore(
        tok,
        generator,
        invoker,
        RolloutConfig(**settings),
        verifier=invoker,
        processor=processor if vision else None,
    )
    task = Task([{"role": "user", "content": "Read the label."}], tools=[ZOOM])
    trajectory = asyncio.run(core.run(task))
    assert trajectory.error is None, trajectory.error
    return trajectory, generator


def pad_counts(processor: Any, ids: list[int]) -> list[int]:
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    runs: list[int] = []
    for i, token in enumerate(ids):
        if token == pad:
            if i and ids[i - 1] == pad:
                runs[-1] += 1
            else:
                runs.append(1)
    return runs


def grid_tokens(processor: Any, images: list[Any]) -> list[int]:
    grid = processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
    return [int(g.prod()) // processor.image_processor.merge_size**2 for g in grid]


def test_an_image_result_is_spliced_as_image_tokens_under_mask_zero(processor: Any) -> None:
    blocks = [png_block(200, 150, seed=1), png_block(90, 300, seed=2)]
    invoker = ImageInvoker({"zoom": blocks})
    tr, generator = roll(processor, invoker, [_call("zoom", "a"), "<answer>K7QX</answer>"])
    assert tr.stop_reason == StopReason.ANSWER
    # The tool message keeps the result's blocks as they came (docs/images.md's format).
    tool = tr.messages[2]
    assert tool["role"] == "tool" and tool["content"][0] == {"type": "text", "text": "View a."}
    assert tool["content"][1:] == blocks and tool["content"][1] is blocks[0]
    # One run of pad tokens per image, as long as the image's grid says, all observation tokens.
    counts = pad_counts(processor, tr.response_ids)
    assert counts == grid_tokens(processor, tr.images) and len(counts) == 2
    assert counts[0] != counts[1]
    image_ids = {
        processor.tokenizer.convert_tokens_to_ids(t)
        for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
    }
    for token, mask, logprob in zip(tr.response_ids, tr.response_mask, tr.response_logprobs, strict=True):
        if token in image_ids:
            assert mask == 0 and logprob == 0.0
    assert tr.metrics["images"] == 2 and tr.metrics["image_tokens"] == sum(counts)
    # The whole sequence is the processor's own rendering of the conversation.
    text = processor.apply_chat_template(tr.messages, tokenize=False, tools=[ZOOM])
    rendered = processor(text=[text], images=tr.images)["input_ids"][0]
    assert list(rendered) == tr.prompt_ids + tr.response_ids + _ids(processor, "\n")
    # The images are the decoded blocks, and the engine got them with the turn after them.
    assert [im.tobytes() for im in tr.images] == [decode_image(b).tobytes() for b in blocks]
    first, second = generator.calls_for(tr.session_id)
    assert first.image_data is None and second.image_data is not None and len(second.image_data) == 2
    # The verifier gets the messages without the pixels.
    (request,) = invoker.verified
    sent = request.messages[2]["content"]
    assert sent[1] == {"type": "image", "mimeType": "image/png"} and "data" in tr.messages[2]["content"][1]


def test_the_tiny_vlm_forward_takes_the_trajectory(processor: Any) -> None:
    invoker = ImageInvoker({"zoom": [png_block(120, 120, seed=3)]})
    tr, _ = roll(processor, invoker, [_call("zoom", "a"), _call("zoom", "b"), "<answer>x</answer>"])
    assert len(tr.images) == 2
    inputs = training_inputs(processor, tr.prompt_ids + tr.response_ids, tr.images)
    model = tiny_model(processor)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, len(tr.prompt_ids) + len(tr.response_ids), len(processor.tokenizer))
    assert torch.isfinite(logits).all()
    # One image short: the pad tokens no longer match the pixels, and that is an error.
    with pytest.raises(ValueError, match="image tokens"):
        training_inputs(processor, tr.prompt_ids + tr.response_ids, tr.images[:1])


def test_an_image_over_the_observation_budget_becomes_a_visible_note(processor: Any) -> None:
    small, large = png_block(60, 60, seed=4), png_block(400, 400, seed=5)
    invoker = ImageInvoker({"zoom": [small, large]})
    full, _ = roll(processor, invoker, [_call("zoom", "a"), "<answer>x</answer>"])
    small_tokens, large_tokens = pad_counts(processor, full.response_ids)
    assert small_tokens < large_tokens
    budget = small_tokens + large_tokens  # room for the small image and the text, not for both images
    tr, _ = roll(processor, invoker, [_call("zoom", "a"), "<answer>x</answer>"], max_obs_tokens=budget)
    assert tr.stop_reason == StopReason.ANSWER
    assert pad_counts(processor, tr.response_ids) == [small_tokens]
    assert len(tr.images) == 1 and tr.metrics["images_not_shown"] == 1
    content = tr.messages[2]["content"]
    assert content[1] is small
    assert content[2]["type"] == "text" and content[2]["text"].startswith(
        "[image not shown (image/png, 400x400 px)"
    )
    assert f"do not fit max_obs_tokens={budget}" in content[2]["text"]
    assert content[2]["text"] in processor.tokenizer.decode(tr.response_ids)
    # The observation tokens stay within the budget (plus the template's own tokens).
    observation = [t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m == 0]
    assert len(observation) <= budget + 40


def test_an_image_past_the_response_budget_ends_the_trajectory_whole(processor: Any) -> None:
    invoker = ImageInvoker({"zoom": [png_block(300, 300, seed=6)]})
    first_turn = len(_ids(processor, _call("zoom", "a"))) + 1
    tr, _ = roll(
        processor, invoker, [_call("zoom", "a"), "<answer>x</answer>"], response_length=first_turn + 20
    )
    assert tr.stop_reason == StopReason.LENGTH
    assert pad_counts(processor, tr.response_ids) == [] and tr.images == []
    assert tr.response_mask == [1] * len(tr.response_ids)


def test_a_text_only_model_is_told_an_image_was_not_shown(processor: Any) -> None:
    invoker = ImageInvoker({"zoom": [png_block(64, 48, seed=7)]})
    tr, generator = roll(processor, invoker, [_call("zoom", "a"), "<answer>x</answer>"], vision=False)
    content = tr.messages[2]["content"]
    assert content == "View a.\n[image not shown (image/png, 64x48 px): the model reads text only]"
    assert tr.images == [] and "images" not in tr.metrics
    assert all(c.image_data is None for c in generator.calls)
    assert pad_counts(processor, tr.response_ids) == []


def test_text_only_trajectories_keep_their_form(processor: Any) -> None:
    """No images: string contents, no image metrics or keys, no image_data, and the record's
    segments decoded as before."""
    invoker = ImageInvoker({"zoom": []})
    tr, generator = roll(processor, invoker, [_call("zoom", "a"), "<answer>x</answer>"])
    assert tr.messages[2]["content"] == "View a."
    assert tr.images == [] and not {"images", "image_tokens", "images_not_shown"} & set(tr.metrics)
    assert all(c.image_data is None for c in generator.calls)
    row = TaskRow.from_row({"prompt": tr.task.messages})
    decode = processor.tokenizer.decode
    record = trajectory_record(tr, row, 0, decode)
    start = tr.response_mask.index(0)
    end = tr.response_mask.index(1, start)
    assert record["segments"][1] == {"model": False, "text": decode(tr.response_ids[start:end])}


def test_the_rollout_record_holds_the_images_inline(processor: Any) -> None:
    block = png_block(100, 100, seed=8)
    tr, _ = roll(processor, ImageInvoker({"zoom": [block]}), [_call("zoom", "a"), "<answer>x</answer>"])
    row = TaskRow.from_row({"prompt": tr.task.messages})
    record = orjson.loads(orjson.dumps(trajectory_record(tr, row, 0, processor.tokenizer.decode)))
    assert record["messages"][2]["content"][1] == block
    (count,) = pad_counts(processor, tr.response_ids)
    observation = record["segments"][1]["text"]
    assert f"<|vision_start|><|image_pad|>×{count}<|vision_end|>" in observation
    assert "<|image_pad|><|image_pad|>" not in observation
    assert record["response_ids"] == tr.response_ids


def test_counted_image_tokens_agree_with_the_processor_or_are_not_used(processor: Any) -> None:
    """The renderer writes the pads itself once its counts matched the processor's own call
    on the first observations; a processor whose count disagrees is called every time."""
    turn = _ids(processor, _call("zoom", "a"))

    def observation(seed: int) -> list[dict[str, Any]]:
        block = png_block(40 + 37 * seed, 300 - 23 * seed, seed=seed)
        return [{"role": "tool", "name": "zoom", "content": [{"type": "text", "text": "View."}, block]}]

    def by_processor(obs: list[dict[str, Any]]) -> list[int]:
        slow = VisionChatRenderer(processor.tokenizer, processor)
        slow._fast_checks_left = -1
        return slow.splice(obs, turn).ids

    counted = VisionChatRenderer(processor.tokenizer, processor)
    for seed in range(12):
        obs = observation(seed)
        assert counted.splice(obs, turn).ids == by_processor(obs)
    assert counted._fast_checks_left == 0  # the last four took the counted path
    lying = copy.copy(processor)
    lying._get_num_multimodal_tokens = lambda image_sizes, **_: {"num_image_tokens": [3] * len(image_sizes)}
    fallback = VisionChatRenderer(lying.tokenizer, lying)
    assert fallback.splice(observation(1), turn).ids == by_processor(observation(1))
    assert fallback._fast_checks_left == -1


def test_long_text_beside_an_image_is_cut_and_the_image_kept_in_place(processor: Any) -> None:
    block = png_block(60, 60, seed=9)
    budget = 80
    words = "word " * 300
    tr, _ = roll(
        processor,
        ImageInvoker({"zoom": [block]}),
        [_call("zoom", words), "<answer>x</answer>"],
        max_obs_tokens=budget,
    )
    content = tr.messages[2]["content"]
    assert content[1] is block and len(tr.images) == 1
    assert content[0]["type"] == "text" and content[0]["text"].startswith("View word word")
    assert "...[truncated " in content[0]["text"] and "images_not_shown" not in tr.metrics
    start = tr.response_mask.index(0)
    end = tr.response_mask.index(1, start)
    empty = roll(processor, ImageInvoker({"zoom": []}), [_call("zoom", ""), "<answer>x</answer>"])[0]
    overhead = empty.response_mask.count(0) - len(_ids(processor, "View ."))
    marker = len(_ids(processor, TRUNCATION_MARKER.format(n=1000)))
    assert end - start <= budget + overhead + marker + 2  # as for text: the marker comes on top
