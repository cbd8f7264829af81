"""``trainer-client show``: image observations marked, each call's figures and the verifier's details.

The record (``tests.workbench.rollouts.image_record``, shared with the workbench's test) is
in the format of docs/images.md ("Images in trajectories").
"""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest

from tests.support.require import require
from tests.workbench.rollouts import image_record
from trainer_client.cli.command import main

require("PIL", reason="Pillow (images extra) renders the test picture")


def show(tmp_path: Path, record: dict, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "t.jsonl"
    path.write_bytes(orjson.dumps(record) + b"\n")
    assert main(["show", str(path), "--color", "never"]) == 0
    return capsys.readouterr().out


def test_images_are_marked_with_type_pixels_and_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = image_record()
    out = show(tmp_path, record, capsys)
    png_kb = round(len(base64.b64decode(record["messages"][2]["content"][1]["data"])) / 1024)
    assert f"[image 1: image/png 640x480, {png_kb} KB]" in out
    assert "[image 2: image/jpeg 32x16, 1 KB]" in out
    assert "base64" not in out and record["messages"][2]["content"][1]["data"][:40] not in out
    # each result with its call's figures: latency, cache hit, error kind
    assert "[tool zoom · 12.5 ms, cache hit] Zoom on (0, 0)-(64, 48), 10x. [image 1:" in out
    assert "[tool rotate · 0.4 ms, error invalid_arguments] Error (invalid_arguments)" in out
    assert "[tool zoom · 0.0 ms] (result not shown to the model)" in out  # cut by the budget
    assert 'verifier\'s details: {"matched":["label 7"],"zoomed":true}' in out


def test_an_unreadable_or_dropped_image_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = image_record()
    blocks = record["messages"][2]["content"]
    blocks[1] = {
        "type": "image",
        "data": base64.b64encode(b"not a picture").decode(),
        "mimeType": "image/png",
    }
    blocks[2] = {"type": "image", "mimeType": "image/jpeg"}  # the verifier's copy: no data
    out = show(tmp_path, record, capsys)
    assert "[image 1: image/png, unreadable:" in out
    assert "[image 2: image/jpeg, data not stored]" in out


def test_a_record_from_before_calls_were_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = image_record()
    del record["calls"], record["reward_details"]
    out = show(tmp_path, record, capsys)
    assert "[tool zoom] Zoom on" in out and "[tool rotate] Error (invalid_arguments)" in out
    assert "verifier's details" not in out and "not shown to the model" not in out
