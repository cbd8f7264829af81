"""The TensorBoard event-file reader behind the Training page: a file still being written, thinning, tensor forms."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.support.require import require
from tool_server.workbench.tensorboard import ScalarReader, _tensor_scalar, thin

tb_summary = require("tensorboard.summary", reason="tensorboard (trainer extra)")


def event_file(directory: Path, points: int) -> Path:
    writer = tb_summary.Writer(str(directory))
    for step in range(points):
        writer.add_scalar("loss", 1.0 / (step + 1), step=step)
    writer.close()
    (path,) = directory.iterdir()
    return path


def test_a_file_being_written_is_read_up_to_its_last_whole_record_then_onwards(tmp_path: Path) -> None:
    whole = event_file(tmp_path / "source", 10).read_bytes()
    growing = tmp_path / "run" / "events.out.tfevents.1.host"
    growing.parent.mkdir()
    growing.write_bytes(whole[:-7])  # the last record cut short
    reader = ScalarReader()
    assert [s for s, _ in reader.scalars(growing).scalars["loss"]] == list(range(9))
    with open(growing, "ab") as handle:
        handle.write(whole[-7:])
    read = reader.scalars(growing)
    assert [s for s, _ in read.scalars["loss"]] == list(range(10))
    assert read.offset == len(whole) and read.skipped == 0
    assert read.scalars["loss"][3][1] == pytest.approx(0.25)


def test_a_damaged_record_is_skipped_and_counted(tmp_path: Path) -> None:
    data = bytearray(event_file(tmp_path / "source", 3).read_bytes())
    path = tmp_path / "events.out.tfevents.2.host"
    bad = b"\xff" * 9  # not a protobuf message
    path.write_bytes(bytes(data) + struct.pack("<Q", len(bad)) + b"\0" * 4 + bad + b"\0" * 4)
    read = ScalarReader().scalars(path)
    assert len(read.scalars["loss"]) == 3 and read.skipped == 1


def test_long_curves_are_thinned_keeping_the_last_point() -> None:
    points = [(s, float(s)) for s in range(10_001)]
    thinned = thin(points, 2000)
    assert len(thinned) <= 2000 and thinned[0] == (0, 0.0) and thinned[-1] == (10_000, 10_000.0)
    assert thin(points[:50], 2000) == points[:50]


def test_scalar_tensors_in_each_form() -> None:
    from tensorboard.compat.proto import tensor_pb2

    assert _tensor_scalar(tensor_pb2.TensorProto(dtype=1, float_val=[0.5])) == 0.5
    assert _tensor_scalar(tensor_pb2.TensorProto(dtype=2, tensor_content=struct.pack("<d", 2.25))) == 2.25
    assert _tensor_scalar(tensor_pb2.TensorProto(dtype=9, tensor_content=struct.pack("<q", 7))) == 7.0
    assert _tensor_scalar(tensor_pb2.TensorProto(dtype=1, float_val=[1.0, 2.0])) is None  # not a scalar
