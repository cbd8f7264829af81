"""What splicing an image observation costs the rollout core (client CPU, per view).

A tool result with the image environment's 768x576 overview (a PNG view, drawn by the pack)
is spliced by ``vision.VisionChatRenderer`` with a Qwen2-VL processor at Qwen2.5-VL's own
``max_pixels`` (567 image tokens), side by side in one run:

* ``counted``: the renderer's normal path once its first checks passed: the processor
  counts the image's tokens from its size, the pads are written into the text, the codec
  tokenizes it (decoding the PNG is included: the engine and the trainer need the image);
* ``processor``: the processor's own call (it also computes every pixel value, which a
  splice does not need): the path the renderer falls back to;
* ``text``: the same observation without the image (the memoized text path).

The processor is ``tests/support/tiny_vlm.py``'s (SmolLM2's tokenizer plus the vision
tokens); a real Qwen2.5-VL processor does the same work for an image.

    .venv/bin/python bench/client/vision_splice.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

QWEN25_VL_MAX_PIXELS = 12845056


def per_call_ms(fn: Any, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up, in milliseconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    from tests.support.tiny_vlm import tiny_processor
    from tools.envs.image_env import pack
    from trainer_client.backends.models import load_tokenizer
    from trainer_client.templates.vision import VisionChatRenderer

    env = pack(seed=0, tasks=1)
    view = env.call(env.new_world(env.tasks[0]), "view_image", {})
    (block,) = [b for b in view.content if b["type"] == "image"]
    processor = tiny_processor(load_tokenizer("smollm2"), max_pixels=QWEN25_VL_MAX_PIXELS)
    text = "View of the whole image."
    with_image = [{"role": "tool", "name": "view_image", "content": [{"type": "text", "text": text}, block]}]
    text_only = [{"role": "tool", "name": "view_image", "content": text}]

    counted = VisionChatRenderer(processor.tokenizer, processor)
    turn = processor.tokenizer.backend_tokenizer.encode("<tool_call>x</tool_call>").ids
    for _ in range(10):  # past the checks against the processor's own call
        splice = counted.splice(with_image, turn)
    assert counted._fast_checks_left == 0, "the counted path disagreed with the processor"
    fallback = VisionChatRenderer(processor.tokenizer, processor)
    fallback._fast_checks_left = -1  # as after a disagreement: the processor's own call
    assert fallback.splice(with_image, turn).ids == splice.ids

    rows = [
        ("counted", per_call_ms(lambda: counted.splice(with_image, turn), args.repeats)),
        ("processor", per_call_ms(lambda: fallback.splice(with_image, turn), args.repeats)),
        ("text", per_call_ms(lambda: counted.splice(text_only, turn), args.repeats)),
    ]
    print(f"768x576 PNG view ({len(block['data'])} base64 chars), {splice.image_tokens[0]} image tokens")
    base = rows[0][1]
    for name, ms in rows:
        print(f"{name:>10}: {ms:8.2f} ms per splice  ({ms / base:5.2f}x counted)")


if __name__ == "__main__":
    main()
