"""Scalar curves from TensorBoard event files (veRL runs, ``trainer-client train --tensorboard``).

An event file is a TFRecord stream: per record an 8-byte little-endian length, 4 bytes of
its masked CRC, the payload (one ``Event`` protobuf), 4 bytes of the payload's CRC. The
framing is read here; the payload is parsed with ``tensorboard.compat.proto.event_pb2``,
imported on first use (no TensorFlow, no torch), so a server without tensorboard
installed still serves every other page and says what is missing for these files. The
CRCs are not checked (crc32c is not in the standard library): a record cut short, as the
last one of a file still being written is, ends the read, and the next read goes on from
there.

Scalars come in two forms: ``simple_value`` (torch's ``SummaryWriter.add_scalar``, what
veRL writes) and a one-element ``tensor`` whose tag's plugin is ``scalars`` (TensorBoard's
own writers and TF2 summaries; the plugin is named in the first event of a tag only).
"""

from __future__ import annotations

import math
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EVENT_FILE_MARK", "ScalarReader", "TensorBoardMissing"]

EVENT_FILE_MARK = "tfevents"  # events.out.tfevents.<time>.<host>...
MAX_CACHED_FILES = 64
MAX_POINTS = 2000  # per curve sent to the browser: longer ones are thinned, the last point kept
_HEADER = struct.Struct("<Q")
_TENSOR_FORMATS = {1: "f", 2: "d", 3: "i", 9: "q"}  # DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64


class TensorBoardMissing(RuntimeError):
    """tensorboard (its protobuf classes) is not installed where the server runs."""


def _event_class() -> Any:
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError as exc:
        raise TensorBoardMissing(
            f"reading TensorBoard event files needs the tensorboard package on the server ({exc}); "
            "pip install tensorboard (the trainer extra has it)"
        ) from None
    return event_pb2.Event


@dataclass
class _File:
    offset: int = 0  # bytes read so far (whole records only)
    mtime_ns: int = 0
    plugins: dict[str, str] = field(default_factory=dict)  # tag -> plugin, from its first event
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    skipped: int = 0  # non-finite values and records that did not parse


class ScalarReader:
    """Per-file scalars, read once and then from where the last read stopped.

    Blocking (file reads, protobuf parsing): call it from a worker thread.
    """

    def __init__(self) -> None:
        self._files: OrderedDict[Path, _File] = OrderedDict()
        self._lock = threading.Lock()

    def scalars(self, path: Path) -> _File:
        """The scalars of one event file, up to its last complete record."""
        with self._lock:
            stat = path.stat()
            read = self._files.get(path)
            if read is None or stat.st_size < read.offset:  # new, or rewritten shorter
                read = _File()
            if stat.st_size != read.offset or stat.st_mtime_ns != read.mtime_ns:
                _extend(path, read, _event_class())
                read.mtime_ns = stat.st_mtime_ns
            self._files[path] = read
            self._files.move_to_end(path)
            while len(self._files) > MAX_CACHED_FILES:
                self._files.popitem(last=False)
            return read

    def run_scalars(self, files: list[Path]) -> dict[str, list[tuple[int, float]]]:
        """Every tag of a run's event files (a restarted run writes several), in file-name order."""
        merged: dict[str, list[tuple[int, float]]] = {}
        for path in sorted(files):
            for tag, points in self.scalars(path).scalars.items():
                merged.setdefault(tag, []).extend(points)
        return merged

    def tags(self, files: list[Path]) -> dict[str, Any]:
        """``{"tags": {tag: points}, "skipped": n}`` of a run, or ``{"error": why}``."""
        try:
            scalars = self.run_scalars(files)
            skipped = sum(self.scalars(path).skipped for path in files)
        except TensorBoardMissing as exc:
            return {"files": len(files), "error": str(exc)}
        except OSError as exc:
            return {"files": len(files), "error": f"could not read an event file: {exc}"}
        return {
            "files": len(files),
            "tags": {t: len(p) for t, p in sorted(scalars.items())},
            "skipped": skipped,
        }

    def curve(self, files: list[Path], tag: str) -> list[tuple[int, float]]:
        """One tag's ``(step, value)`` points, at most ``MAX_POINTS`` of them."""
        return thin(self.run_scalars(files).get(tag, []))


def thin(points: list[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """Every k-th point so that at most ``limit`` remain, the last one always kept."""
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / (limit - 1))
    return [*points[:-1:stride], points[-1]]


def _extend(path: Path, read: _File, event_class: Any) -> None:
    with open(path, "rb") as handle:
        handle.seek(read.offset)
        while True:
            header = handle.read(12)
            if len(header) < 12:
                break
            (length,) = _HEADER.unpack_from(header)
            payload = handle.read(length)
            footer = handle.read(4)
            if len(payload) < length or len(footer) < 4:
                break  # a record still being written: read once it is complete
            read.offset += 12 + length + 4
            try:
                event = event_class.FromString(payload)
            except Exception:  # protobuf's DecodeError: a damaged record, skipped and counted
                read.skipped += 1
                continue
            if event.HasField("summary"):
                _add_summary(event.step, event.summary, read)


def _add_summary(step: int, summary: Any, read: _File) -> None:
    for value in summary.value:
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
            read.plugins.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            number: float | None = value.simple_value
        elif kind == "tensor" and read.plugins.get(value.tag) == "scalars":
            number = _tensor_scalar(value.tensor)
        else:
            continue  # histograms, images, text: not a curve
        if number is None or not math.isfinite(number):
            read.skipped += 1
            continue
        read.scalars.setdefault(value.tag, []).append((step, number))


def _tensor_scalar(tensor: Any) -> float | None:
    for values in (tensor.float_val, tensor.double_val, tensor.int_val, tensor.int64_val):
        if len(values) == 1:
            return float(values[0])
    fmt = _TENSOR_FORMATS.get(tensor.dtype)
    if fmt and len(tensor.tensor_content) == struct.calcsize(fmt):
        return float(struct.unpack("<" + fmt, tensor.tensor_content)[0])
    return None
