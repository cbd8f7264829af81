"""Rollout files for the tests: a real one, cheaply, and a hand-built one with images.

The real one: ``trainer-client rollout --script`` against a real server. The scripted backend replays fixed assistant turns (no model), but everything else is the
real thing: the SmolLM2 chat template and tokenizer, the calculator through /v1/calls,
the math_equal verifier, the JSONL the CLI writes (as in tests/trainer/test_cli.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from protocol.images import image_block
from tests.support.image_tools import expected_picture
from tests.support.server import running_server, server_config


def calculator_call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def scripted_rollout(out_dir: Path) -> Path:
    """``out_dir/scripted.jsonl``: 3 prompts x 2 samples (solved, a failing tool call, a guess)."""
    import pandas as pd

    data = out_dir / "data"
    subprocess.run(
        [sys.executable, "-m", "tools.data", "build", "--out", str(data), "--tasks", "arithmetic"]
        + ["--arith-train", "4", "--arith-test", "4"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    parquet = data / "arithmetic" / "test.parquet"
    row = pd.read_parquet(parquet).iloc[0]
    expression, answer = row["extra_info"]["expression"], str(row["reward_model"]["ground_truth"])
    script = out_dir / "turns.jsonl"
    script.write_bytes(
        b"".join(
            orjson.dumps(entry) + b"\n"
            for entry in [
                [calculator_call(expression), f"<answer>{answer}</answer>"],
                {"index": 2, "turns": ["I guess <answer>7</answer>"]},
                {"turns": [calculator_call("1/0"), "no idea"]},
            ]
        )
    )
    out = out_dir / "scripted.jsonl"
    config = server_config(verifiers=[{"target": "tools.verifiers.math:math_equal"}])
    with running_server(config) as server:
        # a subprocess: the browser tests' Playwright runs an event loop in this thread
        subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer_client.cli.command",
                "rollout",
                "--server",
                server.url,
                "--data",
                str(parquet),
            ]
            + ["--limit", "3", "--n", "2", "--script", str(script), "--verifier", "math_equal"]
            + ["--out", str(out), "--no-progress"],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return out


def image_record() -> dict:
    """A hand-built trajectory with images, in the format of docs/images.md ("Images in trajectories").

    A zoom result with a 640x480 PNG and a 32x16 JPEG beside its text, a failed call, and a
    call the response budget cut before its result was spliced; Pillow renders the pictures.
    """
    png = expected_picture(640, 480, seed=3)
    jpeg = expected_picture(32, 16, seed=4, fmt="jpeg")
    return {
        "id": "s-img",
        "index": 0,
        "sample": 0,
        "data_source": "env/image",
        "reward": 1.0,
        "reward_components": {"answer": 1.0},
        "reward_details": {"matched": ["label 7"], "zoomed": True},
        "stop_reason": "answer",
        "num_turns": 5,
        "messages": [
            {"role": "user", "content": "Read the label."},
            {"role": "assistant", "content": "<tool_call>zoom</tool_call>"},
            {
                "role": "tool",
                "name": "zoom",
                "content": [
                    {"type": "text", "text": "Zoom on (0, 0)-(64, 48), 10x."},
                    image_block(png),
                    image_block(jpeg),
                ],
            },
            {"role": "assistant", "content": "<tool_call>rotate</tool_call>"},
            {"role": "tool", "name": "rotate", "content": "Error (invalid_arguments): angle must be 90"},
            {"role": "assistant", "content": "<answer>7</answer>"},
        ],
        "calls": [
            {"turn": 1, "message": 2, "name": "zoom", "elapsed_ms": 12.5, "cached": True, "error": None},
            {
                "turn": 2,
                "message": 4,
                "name": "rotate",
                "elapsed_ms": 0.4,
                "cached": False,
                "error": "invalid_arguments",
            },
            {"turn": 3, "message": 6, "name": "zoom", "elapsed_ms": 0.0, "cached": False, "error": None},
        ],
        "num_prompt_messages": 1,
        "segments": [
            {"model": True, "text": "<tool_call>zoom</tool_call>"},
            {"model": False, "text": "<|vision_start|><|image_pad|>×420<|vision_end|>"},
        ],
        "response_ids": [1, 2, 3],
        "response_mask": [1, 0, 0],
    }
