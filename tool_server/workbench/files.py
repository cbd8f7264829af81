"""Rollout JSONL files for the workbench: where they may be, and a line index to page through them.

A trajectories file can hold 100k lines of several kilobytes each; the browser never gets
it whole. ``TrajectoryIndex`` reads a file once (then only what was appended since),
keeps each line's byte offset and a few summary fields in numpy columns (no Python object
per line), and answers filtered pages from those; one trajectory is read back by seeking to
its offset. Lines per file and the memory of all indexes are capped. The record format is the
one ``trainer-client rollout`` writes (its ``trajectory_record``), read as plain JSON: the tool
server never imports the trainer client. Every field is type-checked: a record with a field
of the wrong type is marked in the listing, and the view gets the record without that field.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tool_server.config import ConfigError

__all__ = ["FileError", "Files", "TrajectoryIndex", "checked_record", "summary_of"]

UPLOAD_PREFIX = "upload:"
MAX_UPLOADS = 16  # per tenant: its oldest upload goes when another arrives
MAX_INDEXED_FILES = 8  # indexes kept in memory (besides workbench.index_max_bytes)
MIN_INDEX_BYTES = 1024 * 1024
MAX_LISTED_FILES = 2000
MAX_NAME_CHARS = 1024  # a file name the UI asks for; longer ones are refused
MAX_PART_CHARS = 255  # one path component (the kernel's NAME_MAX, in bytes)
MAX_UPLOAD_NAME = 100  # an upload's own name is cut to this, its suffix kept


class FileError(ValueError):
    """A file the UI asked for is not one it may open; the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _shown(name: str) -> str:
    """``name`` for a message: quoted, a long one cut."""
    return repr(name if len(name) <= 80 else name[:79] + "…")


def _checked_name(name: str) -> None:
    if "\x00" in name:
        raise FileError(f"file name {_shown(name)} contains a NUL character; no file has one")
    if len(name) > MAX_NAME_CHARS or any(len(part) > MAX_PART_CHARS for part in name.split("/")):
        raise FileError(
            f"file name {_shown(name)} is too long ({len(name)} characters; at most {MAX_NAME_CHARS}, "
            f"{MAX_PART_CHARS} per path component)"
        )


def _upload_name(filename: str) -> str:
    """An uploaded file's own name, made safe to show and to store: printable, short, no path."""
    base = Path("".join(c for c in filename if c.isprintable() and c != "\\")).name or "upload.jsonl"
    if len(base) > MAX_UPLOAD_NAME:
        stem, suffix = os.path.splitext(base)
        suffix = suffix[:16]
        base = stem[: MAX_UPLOAD_NAME - len(suffix)] + suffix
    return base


class Files:
    """Maps the names the UI uses to paths: relative to ``runs_dir``, or ``upload:<id>/<name>``.

    The runs directory is the server's, shown to every token that may read files; an upload
    is its tenant's: another tenant neither lists nor opens it, nor pushes it out.
    """

    def __init__(self, runs_dir: str | None) -> None:
        self.runs_dir = Path(runs_dir).expanduser().resolve() if runs_dir else None
        self._upload_dir: tempfile.TemporaryDirectory[str] | None = None  # made at the first upload
        self.uploads: dict[str, OrderedDict[str, Path]] = {}  # tenant -> name -> path, oldest first

    def resolve(self, name: str, tenant: str) -> Path:
        """The path of ``name``, refused (FileError) when it is outside the runs directory."""
        _checked_name(name)
        if name.startswith(UPLOAD_PREFIX):
            path = self.uploads.get(tenant, {}).get(name)
            if path is None:
                raise FileError(
                    f"no upload named {_shown(name)} (uploads are kept while the server runs)", 404
                )
            return path
        if self.runs_dir is None:
            raise FileError(
                "this server has no runs directory (config: workbench.runs_dir); upload a file", 404
            )
        try:
            path = (self.runs_dir / name).resolve()
            if not path.is_relative_to(self.runs_dir):
                raise FileError(f"{_shown(name)} is outside the runs directory", 403)
            if not path.is_file():
                raise FileError(f"no file {_shown(name)} in the runs directory", 404)
        except OSError as exc:  # a name the kernel refuses (too long in bytes, a loop of links)
            raise FileError(f"cannot open {_shown(name)}: {exc.strerror}") from None
        return path

    def listing(self, suffix: str, tenant: str) -> list[dict[str, Any]]:
        """Files ending in ``suffix`` under the runs directory (newest first), then the tenant's uploads;
        each with its ``path`` (for the server, not the page)."""
        found: list[tuple[float, str, int, Path]] = []
        if self.runs_dir is not None and self.runs_dir.is_dir():
            for root, dirs, names in os.walk(self.runs_dir):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in names:
                    if name.endswith(suffix):
                        path = Path(root) / name
                        with contextlib.suppress(OSError):  # gone since the walk listed it
                            stat = path.stat()
                            relative = str(path.relative_to(self.runs_dir))
                            found.append((stat.st_mtime, relative, stat.st_size, path.resolve()))
                if len(found) >= MAX_LISTED_FILES:
                    break
        found.sort(reverse=True)
        files = [
            {"name": name, "bytes": size, "mtime": mtime, "path": path} for mtime, name, size, path in found
        ]
        for name, path in reversed(self.uploads.get(tenant, {}).items()):
            stat = path.stat()
            files.append({"name": name, "bytes": stat.st_size, "mtime": stat.st_mtime, "path": path})
        return files

    def add_upload(self, filename: str, body: bytes, tenant: str) -> str:
        """Keep an uploaded file for ``tenant``; its name for later requests."""
        name = f"{UPLOAD_PREFIX}{uuid.uuid4().hex[:8]}/{_upload_name(filename)}"
        if self._upload_dir is None:
            self._upload_dir = tempfile.TemporaryDirectory(prefix="toolfactory-ui-")
        path = Path(self._upload_dir.name) / name.removeprefix(UPLOAD_PREFIX).replace("/", "-")
        path.write_bytes(body)
        mine = self.uploads.setdefault(tenant, OrderedDict())
        mine[name] = path
        while len(mine) > MAX_UPLOADS:
            _, old = mine.popitem(last=False)
            old.unlink(missing_ok=True)
        return name

    def close(self) -> None:
        """Delete the uploads."""
        if self._upload_dir is not None:
            self._upload_dir.cleanup()
            self._upload_dir = None
        self.uploads.clear()


# ----------------------------------------------------------------- what a record holds

# The fields the page reads, each with (a cheap check for the listing, the full check for the
# view, what it should be). A record that fails one is marked in the listing; the view drops
# the field and says why. None (or absent) is always allowed: old files lack newer fields.
Check = Callable[[Any], bool]


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**31


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


def _is_mask(value: Any) -> bool:
    # counted in C; True/False and 1.0/0.0 count as 1/0
    return isinstance(value, list) and value.count(0) + value.count(1) == len(value)


def _is_objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(item) is int and 0 <= item < 2**32 for item in value)


def _is_numbers(value: Any) -> bool:
    return isinstance(value, list) and all(item is None or type(item) in (int, float) for item in value)


FIELDS: dict[str, tuple[Check, Check, str]] = {
    "id": (_is_str, _is_str, "a string"),
    "index": (_is_int, _is_int, "an integer (the prompt's row)"),
    "sample": (_is_int, _is_int, "an integer"),
    "data_source": (_is_str, _is_str, "a string"),
    "reward": (_is_number, _is_number, "a number"),
    "stop_reason": (_is_str, _is_str, "a string"),
    "num_turns": (_is_count, _is_count, "a count"),
    "error": (_is_str, _is_str, "a string"),
    "metrics": (_is_dict, _is_dict, "an object"),
    "response_mask": (_is_list, _is_mask, "a list of 0s and 1s"),  # the listing sums it
    "response_ids": (_is_list, _is_ids, "a list of token ids"),
    "response_logprobs": (_is_list, _is_numbers, "a list of numbers"),
    "messages": (_is_objects, _is_objects, "a list of chat messages (objects)"),
    "calls": (_is_objects, _is_objects, "a list of objects"),
    "segments": (_is_objects, _is_objects, "a list of objects"),
    "num_prompt_messages": (_is_count, _is_count, "a count"),
    "reward_components": (_is_dict, _is_dict, "an object"),
    "reward_details": (_is_dict, _is_dict, "an object"),
}
METRIC_COUNTS = ("calls", "tool_errors")  # metrics.<name>: counts the listing shows


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number" if not isinstance(value, int) or abs(value) < 2**31 else "a number out of range"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


CHEAP_CHECKS = {name: cheap for name, (cheap, _, _) in FIELDS.items()}
FULL_CHECKS = {name: thorough for name, (_, thorough, _) in FIELDS.items()}


def _wrong(record: dict[str, Any], checks: dict[str, Check]) -> dict[str, str]:
    """Field name (``metrics.<count>`` for those) -> what is wrong with it; walks only the
    fields the record has (a line of the index: a few microseconds)."""
    found = {}
    for name, value in record.items():
        check = checks.get(name)
        if check is not None and value is not None and not check(value):
            expected = FIELDS[name][2]
            if isinstance(value, list) and expected.startswith("a list"):
                found[name] = f"{name} has items of the wrong type, expected {expected}"
            else:
                found[name] = f"{name} is {_kind(value)}, expected {expected}"
    metrics = record.get("metrics")
    if type(metrics) is dict:
        for name in METRIC_COUNTS:
            value = metrics.get(name)
            if value is not None and not _is_count(value):
                found[f"metrics.{name}"] = f"metrics.{name} is {_kind(value)}, expected a count"
    return found


def checked_record(record: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The record without the fields that would break the view, and what was wrong with them."""
    found = _wrong(record, FULL_CHECKS)
    for name in found:
        if name.startswith("metrics."):
            del record["metrics"][name.removeprefix("metrics.")]
        else:
            del record[name]
    return record, list(found.values())


def summary_of(record: dict[str, Any]) -> dict[str, Any]:
    """The fields the trajectory list shows and filters on, each of its type or None; a record
    with a field of the wrong type is ``malformed`` and its ``error`` says which."""
    found = _wrong(record, CHEAP_CHECKS)
    get = record.get if not found else {k: v for k, v in record.items() if k not in found}.get
    metrics = get("metrics") or {}
    mask = get("response_mask") or []
    try:
        ones = int(sum(mask))  # summed in C (a 4k-token mask a line); the view checks each is 0 or 1
    except TypeError:
        ones, found["response_mask"] = 0, "response_mask has items of the wrong type, expected 0s and 1s"
    return {
        "id": get("id"),
        "index": get("index"),
        "sample": get("sample"),
        "data_source": get("data_source") or "?",
        "reward": get("reward"),
        "stop_reason": get("stop_reason") or "?",
        "num_turns": get("num_turns"),
        "tool_calls": 0 if "metrics.calls" in found else metrics.get("calls") or 0,
        "tool_errors": 0 if "metrics.tool_errors" in found else metrics.get("tool_errors") or 0,
        "tokens": len(mask),
        "model_tokens": ones,
        "error": _cut("malformed record: " + "; ".join(found.values())) if found else get("error"),
        "malformed": bool(found),
    }


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parsed(line: bytes, *, detailed: bool = False) -> dict[str, Any] | str:
    """The record on ``line``, or why there is none (for the index without the error's position:
    a few distinct texts per file)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON: {exc if detailed else exc.msg}"
    return record if isinstance(record, dict) else f"not a JSON object but {_kind(record)}"


def _unreadable(problem: str) -> dict[str, Any]:
    """The summary of a line that holds no record."""
    return {"data_source": "?", "stop_reason": "unreadable", "error": _cut(problem), "malformed": True}


# ----------------------------------------------------------------- the index

ID_BYTES = 48  # of each id, for the listing and the id filter (a session id is 32); the record keeps it whole
MAX_LABELS = 1024  # distinct data sources, stop reasons and error texts kept per file; more share one
OTHER = "(other: more distinct values than the index keeps)"
LABEL_BYTES = 120  # what one label costs besides its text: the list slot and the dict entry
NO_INT = np.iinfo(np.int64).min  # index, sample: absent
NO_COUNT = -1  # num_turns: absent
CHUNK = 4096  # lines parsed before they are added to the columns
TAIL_BYTES = 256  # compared on every request: a file rewritten in place (a rerun) is indexed anew
MAX_CACHED_FILTERS = 8  # per file: a page turn under the same filters does not filter again
DEFAULT_MAX_LINES = 1_000_000  # workbench.index_max_lines
DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # workbench.index_max_bytes

# One numpy array per field (no Python object per line): ~110 bytes a line.
COLUMNS: dict[str, np.dtype[Any]] = {
    name: np.dtype(kind)
    for name, kind in (
        ("offset", np.uint64),
        ("id", f"S{ID_BYTES}"),
        ("index", np.int64),
        ("sample", np.int64),
        ("data_source", np.uint16),  # a label's code
        ("reward", np.float64),  # NaN: none
        ("stop_reason", np.uint16),
        ("num_turns", np.int32),
        ("tool_calls", np.int32),
        ("tool_errors", np.int32),
        ("tokens", np.int32),
        ("model_tokens", np.int32),
        ("error", np.uint16),  # 0: none
        ("malformed", np.bool_),
    )
}
ROW_BYTES = sum(dtype.itemsize for dtype in COLUMNS.values())
LABELLED = ("data_source", "stop_reason", "error")


class _Labels:
    """The distinct strings of one column and their codes: a file's lines share a few data
    sources and stop reasons. Past ``MAX_LABELS`` new values all share the ``OTHER`` label."""

    def __init__(self, first: str) -> None:
        self.names = [first]
        self.codes = {first: 0}

    def code(self, name: str, afford: Callable[[int], bool]) -> int:
        code = self.codes.get(name)
        if code is not None:
            return code
        if len(self.names) >= MAX_LABELS - 1 or not afford(sys.getsizeof(name) + LABEL_BYTES):
            name = OTHER
            if name in self.codes:
                return self.codes[name]
        self.codes[name] = len(self.names)
        self.names.append(name)
        return self.codes[name]


class _Columns:
    """The index's rows: a numpy array per ``COLUMNS`` field, grown to the capacity granted."""

    def __init__(self) -> None:
        self.size = 0
        self.capacity = 0
        self.arrays = {name: np.empty(0, dtype) for name, dtype in COLUMNS.items()}

    def grow(self, capacity: int) -> None:
        for name, old in self.arrays.items():
            new = np.empty(capacity, old.dtype)
            new[: self.size] = old[: self.size]
            self.arrays[name] = new
        self.capacity = capacity

    def append(self, rows: list[tuple[Any, ...]]) -> None:
        """``rows`` of ``COLUMNS`` values; the capacity must hold them."""
        if not rows:
            return
        start, stop = self.size, self.size + len(rows)
        for array, values in zip(self.arrays.values(), zip(*rows, strict=True), strict=True):
            array[start:stop] = values
        self.size = stop

    def __getitem__(self, name: str) -> np.ndarray[Any, Any]:
        return self.arrays[name][: self.size]


@dataclass
class _Index:
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while built and read
    size: int = 0  # bytes indexed so far (whole lines only)
    mtime_ns: int = 0
    inode: int = 0
    tail: bytes = b""  # the last bytes indexed: still there if the file only grew
    columns: _Columns = field(default_factory=_Columns)
    labels: dict[str, _Labels] = field(
        default_factory=lambda: {
            "data_source": _Labels("?"),
            "stop_reason": _Labels("?"),
            "error": _Labels(""),
        }
    )
    # filters -> (rows filtered so far, matching lines); extended, not redone, when the file grows
    matches: OrderedDict[tuple[tuple[str, str], ...], tuple[int, np.ndarray[Any, Any]]] = field(
        default_factory=OrderedDict
    )
    held: int = 0  # bytes of the budget this index holds: its columns' capacity, labels, cached matches
    truncated: str | None = None  # why later lines are not indexed
    building: bool = False  # read without the lock by ``status``
    evicted: bool = False  # dropped from the cache: a request that waited on its lock starts again

    def row(self, line: int) -> dict[str, Any]:
        """One line's summary, as the listing shows it."""
        value = {name: self.columns.arrays[name][line].item() for name in COLUMNS if name != "offset"}
        for name in LABELLED:
            value[name] = self.labels[name].names[value[name]]
        value["id"] = value["id"].decode("utf-8", "replace") or None
        value["error"] = value["error"] or None
        for name in ("index", "sample"):
            value[name] = None if value[name] == NO_INT else value[name]
        value["num_turns"] = None if value["num_turns"] == NO_COUNT else value["num_turns"]
        value["reward"] = None if math.isnan(value["reward"]) else value["reward"]
        return {"line": line, **value}


def _only_grew(path: Path, stat: os.stat_result, index: _Index) -> bool:
    """Whether the file is the one indexed, with at most lines appended: same inode, not shorter,
    and the bytes indexed last are unchanged (a rerun that rewrote it longer fails this)."""
    if stat.st_ino != index.inode or stat.st_size < index.size:
        return False
    if stat.st_size == index.size and stat.st_mtime_ns == index.mtime_ns:
        return True  # untouched: no read
    with open(path, "rb") as handle:
        handle.seek(index.size - len(index.tail))
        return handle.read(len(index.tail)) == index.tail


class TrajectoryIndex:
    """Per-file line offsets and summaries in numpy columns, built once and extended when the
    file grows. At most ``max_lines`` lines of a file are indexed, and all files' indexes
    together hold at most ``max_bytes``: the least recently used go first, and a file that
    alone needs more is indexed up to it (``status`` and each page say so).

    Blocking (file reads, JSON parsing): call it from a worker thread. Each file has its own
    lock, so a page of one file never waits for another file's index to be built.
    """

    def __init__(
        self,
        max_lines: int = DEFAULT_MAX_LINES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = MAX_INDEXED_FILES,
    ) -> None:
        if max_lines < 1:
            raise ConfigError(f"workbench.index_max_lines must be 1 or more, got {max_lines}")
        if max_bytes < MIN_INDEX_BYTES:
            raise ConfigError(
                f"workbench.index_max_bytes must be at least {MIN_INDEX_BYTES} (1 MiB), got {max_bytes}"
            )
        self.max_lines, self.max_bytes, self.max_files = max_lines, max_bytes, max_files
        self._indexes: OrderedDict[Path, _Index] = OrderedDict()  # least recently used first
        self._held = 0  # bytes all indexes hold
        self._lock = threading.Lock()  # the two above; never held while waiting for a file's lock

    @property
    def nbytes(self) -> int:
        """Memory the indexes hold (columns at their capacity, labels, cached filter matches)."""
        return self._held

    def status(self, path: Path) -> dict[str, Any] | None:
        """The index of ``path`` as it stands (being built or not), without waiting for it."""
        index = self._indexes.get(path)
        if index is None:
            return None
        return _status(index)

    @contextlib.contextmanager
    def _ready(self, path: Path) -> Iterator[_Index]:
        """The index of ``path``, up to date, its lock held."""
        while True:
            with self._lock:
                index = self._indexes.get(path)
                if index is None:
                    index = self._indexes[path] = _Index()
                    self._make_room(0, keep=index)
                self._indexes.move_to_end(path)
            with index.lock:
                if index.evicted:
                    continue  # dropped while this request waited: take the new one
                try:
                    self._refresh(path, index)
                except FileNotFoundError:
                    raise FileError(
                        f"{path.name} is gone (deleted or moved while it was read)", 404
                    ) from None
                yield index
                return

    def _refresh(self, path: Path, index: _Index) -> None:
        stat = path.stat()
        if not _only_grew(path, stat, index):  # new, or replaced, or rewritten
            self._release(index, index.held)
            fresh = _Index(inode=stat.st_ino)
            for name in ("columns", "labels", "matches", "size", "mtime_ns", "tail", "truncated", "inode"):
                setattr(index, name, getattr(fresh, name))
        if (stat.st_size != index.size or stat.st_mtime_ns != index.mtime_ns) and index.truncated is None:
            index.building = True
            try:
                self._extend(path, index, stat.st_size)
            finally:
                index.building = False
        index.mtime_ns = stat.st_mtime_ns

    def _extend(self, path: Path, index: _Index, until: int) -> None:
        """Index the whole lines after ``index.size``, up to ``until`` (the size when the request
        came: a file that keeps growing does not keep this request reading)."""
        pending: list[tuple[Any, ...]] = []
        ends: list[int] = []  # each pending line's end
        afford = functools.partial(self._afford, index)  # a new label's memory
        with open(path, "rb") as handle:
            handle.seek(index.size)
            offset = index.size
            for line in handle:
                if offset + len(line) > until or not line.endswith(b"\n"):
                    break  # a line still being written: indexed once it is complete
                if not line.isspace():  # no copy of the line, unlike strip()
                    if index.columns.size + len(pending) >= self.max_lines:
                        index.truncated = (
                            f"only the first {self.max_lines:,} lines of this file are indexed "
                            "(workbench.index_max_lines); later lines are not listed"
                        )
                        break
                    pending.append(self._row(index, offset, line, afford))
                    ends.append(offset + len(line))
                    if len(pending) == CHUNK:
                        committed = self._commit(index, pending, ends)
                        pending, ends = [], []
                        if not committed:
                            break
                offset += len(line)
                if not pending:
                    index.size = offset  # blank lines after the last indexed one
            if pending and self._commit(index, pending, ends):
                index.size = offset
            handle.seek(max(0, index.size - TAIL_BYTES))
            index.tail = handle.read(index.size - max(0, index.size - TAIL_BYTES))

    @staticmethod
    def _row(index: _Index, offset: int, line: bytes, afford: Callable[[int], bool]) -> tuple[Any, ...]:
        """One line's ``COLUMNS`` values."""
        record = _parsed(line)
        summary = summary_of(record) if isinstance(record, dict) else _unreadable(record)
        reward = summary.get("reward")
        num_turns = summary.get("num_turns")
        return (
            offset,
            (summary.get("id") or "")[:ID_BYTES].encode()[:ID_BYTES],
            _int64(summary.get("index")),
            _int64(summary.get("sample")),
            index.labels["data_source"].code(summary["data_source"][:200], afford),
            math.nan if reward is None else reward,
            index.labels["stop_reason"].code(summary["stop_reason"][:200], afford),
            NO_COUNT if num_turns is None else num_turns,
            summary.get("tool_calls", 0),
            summary.get("tool_errors", 0),
            summary.get("tokens", 0),
            summary.get("model_tokens", 0),
            index.labels["error"].code(_cut(summary["error"]), afford) if summary.get("error") else 0,
            summary["malformed"],
        )

    def _commit(self, index: _Index, rows: list[tuple[Any, ...]], ends: list[int]) -> bool:
        """Add ``rows`` to the columns, as many as the memory budget allows; whether all went in."""
        columns = index.columns
        wanted = columns.size + len(rows)
        if wanted > columns.capacity:
            capacity = min(max(wanted, 2 * columns.capacity, CHUNK), self.max_lines)
            granted = self._grant(index, (capacity - columns.capacity) * ROW_BYTES)
            self._release(index, granted % ROW_BYTES)
            if granted >= ROW_BYTES:
                columns.grow(columns.capacity + granted // ROW_BYTES)
        fits = min(len(rows), columns.capacity - columns.size)
        columns.append(rows[:fits])
        if fits < len(rows):
            index.size = ends[fits - 1] if fits else index.size
            index.truncated = (
                f"only the first {columns.size:,} lines of this file are indexed: the trajectory indexes "
                f"hold workbench.index_max_bytes ({self.max_bytes:,} bytes); later lines are not listed"
            )
            return False
        return True

    # ----------------------------------------------------------------- the memory budget

    def _afford(self, index: _Index, nbytes: int) -> bool:
        granted = self._grant(index, nbytes)
        if granted < nbytes:
            self._release(index, granted)
            return False
        return True

    def _grant(self, index: _Index, nbytes: int) -> int:
        """Up to ``nbytes`` more for ``index``, after dropping the least recently used others."""
        with self._lock:
            self._make_room(nbytes, keep=index)
            granted = max(0, min(nbytes, self.max_bytes - self._held))
            index.held += granted
            self._held += granted
            return granted

    def _release(self, index: _Index, nbytes: int) -> None:
        with self._lock:
            index.held -= nbytes
            self._held -= nbytes

    def _make_room(self, nbytes: int, keep: _Index) -> None:
        """Drop the least recently used indexes not in use until ``nbytes`` more fit (and at most
        ``max_files`` are kept). Called with ``self._lock`` held."""
        for path, other in list(self._indexes.items()):
            if self._held + nbytes <= self.max_bytes and len(self._indexes) <= self.max_files:
                return
            if other is keep or not other.lock.acquire(blocking=False):
                continue  # being built or read: its request drops it soon enough
            try:
                del self._indexes[path]
                self._held -= other.held
                other.held, other.evicted = 0, True
                other.columns, other.matches = _Columns(), OrderedDict()
            finally:
                other.lock.release()

    # ----------------------------------------------------------------- reading it

    def page(self, path: Path, filters: dict[str, str], offset: int, limit: int) -> dict[str, Any]:
        """``limit`` rows from ``offset`` among those matching ``filters``, the facets of the file,
        and how the index stands (``index``: lines, bytes, why it stops short of the file's end)."""
        keep = _row_filter(filters)  # checks the values first (a FileError names a bad one)
        with self._ready(path) as index:
            matching = self._matching(index, filters, keep)
            return {
                "total": index.columns.size,
                "matching": len(matching),
                "offset": offset,
                "rows": [index.row(n) for n in matching[offset : offset + limit].tolist()],
                "facets": {name: _facet(index, name) for name in ("data_source", "stop_reason")},
                "index": _status(index),
            }

    def _matching(self, index: _Index, filters: dict[str, str], keep: Keep) -> np.ndarray[Any, Any]:
        """Lines whose rows pass ``filters`` (``keep``); only rows indexed since the last same
        request are filtered."""
        key = tuple(sorted((k, v) for k, v in filters.items() if k in FILTER_KEYS and v != ""))
        done, lines = index.matches.pop(key, (0, np.empty(0, np.uint32)))
        self._release(index, lines.nbytes)
        size = index.columns.size
        if done < size:
            found = np.flatnonzero(keep(index, done, size)).astype(np.uint32) + np.uint32(done)
            lines = np.concatenate((lines, found))
        if self._afford(index, lines.nbytes):  # cached only while the budget allows
            index.matches[key] = (size, lines)
        while len(index.matches) > MAX_CACHED_FILTERS:
            _, (_, old) = index.matches.popitem(last=False)
            self._release(index, old.nbytes)
        return lines

    def record(self, path: Path, line: int) -> dict[str, Any]:
        """The record on (0-based, non-empty) line ``line``, as written."""
        record = _parsed(self._line(path, line), detailed=True)
        if isinstance(record, str):
            raise FileError(f"trajectory {line} is {record}", 422)
        return record

    def trajectory(self, path: Path, line: int) -> dict[str, Any]:
        """Trajectory ``line`` for the view: the record without the fields that would break it,
        what was wrong (``problems``: a line that is no record gives ``{}`` and why), and the
        other samples of its prompt (``siblings``, a GRPO group)."""
        raw = self._line(path, line)
        record = _parsed(raw, detailed=True)
        if isinstance(record, str):
            return {
                "record": {},
                "problems": [f"this line holds no trajectory: it is {record}"],
                "siblings": [],
            }
        record, problems = checked_record(record)
        return {"record": record, "problems": problems, "siblings": self.siblings(path, line)}

    def _line(self, path: Path, line: int) -> bytes:
        with self._ready(path) as index:
            if not 0 <= line < index.columns.size:
                raise FileError(f"no trajectory {line} (the index has {index.columns.size})", 404)
            offset = int(index.columns.arrays["offset"][line])
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.readline()

    def siblings(self, path: Path, line: int) -> list[int]:
        """Lines of the other samples of the same prompt (a GRPO group)."""
        with self._ready(path) as index:
            if not 0 <= line < index.columns.size:
                return []
            prompts, sources = index.columns["index"], index.columns["data_source"]
            if prompts[line] == NO_INT:
                return []
            group = np.flatnonzero((prompts == prompts[line]) & (sources == sources[line]))
            return [n for n in group.tolist() if n != line]


def _int64(value: int | None) -> int:
    return NO_INT if value is None or not -(2**63) < value < 2**63 else value


def _status(index: _Index) -> dict[str, Any]:
    return {
        "lines": index.columns.size,
        "bytes": index.held,
        "building": index.building,
        "truncated": index.truncated,
    }


def _facet(index: _Index, name: str) -> dict[str, int]:
    """The 50 most frequent values of a labelled column and their counts."""
    names = index.labels[name].names
    counts = np.bincount(index.columns[name], minlength=len(names)).tolist()
    ranked = sorted((-count, code) for code, count in enumerate(counts) if count)
    return {names[code]: -negative for negative, code in ranked[:50]}


SEARCH_BLOCK = 65536  # ids searched at once
FILTER_KEYS = ("data_source", "stop_reason", "min_reward", "max_reward", "tool_errors", "q")


def _number(filters: dict[str, str], key: str) -> float | None:
    raw = filters.get(key)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)  # type: ignore[arg-type]
    except ValueError:
        raise FileError(f"{key} must be a number, got {_shown(str(raw))}") from None
    if math.isnan(value):
        raise FileError(f"{key} must be a number, got {_shown(str(raw))}")
    return value


Keep = Callable[[_Index, int, int], "np.ndarray[Any, Any]"]


def _row_filter(filters: dict[str, str]) -> Keep:
    """Which of an index's rows ``start:stop`` pass ``filters`` (a boolean array)."""
    labelled = {name: filters.get(name) or None for name in ("data_source", "stop_reason")}
    low, high = _number(filters, "min_reward"), _number(filters, "max_reward")
    errors = filters.get("tool_errors") or None
    if errors not in (None, "yes", "no"):
        raise FileError(f"tool_errors must be 'yes' or 'no', got {_shown(str(errors))}")
    text = (filters.get("q") or "").lower().encode()

    def keep(index: _Index, start: int, stop: int) -> np.ndarray[Any, Any]:
        def column(name: str) -> np.ndarray[Any, Any]:
            return index.columns.arrays[name][start:stop]

        kept = np.ones(stop - start, np.bool_)
        for name, wanted in labelled.items():
            if wanted is not None:
                code = index.labels[name].codes.get(wanted)
                kept &= (column(name) == code) if code is not None else False
        if low is not None:
            kept &= column("reward") >= low  # NaN (no reward) fails both bounds
        if high is not None:
            kept &= column("reward") <= high
        if errors is not None:
            kept &= (column("tool_errors") > 0) == (errors == "yes")
        if text:
            ids = column("id")
            for at in range(0, len(ids), SEARCH_BLOCK):  # lower-cased a block at a time: a bounded copy
                block = ids[at : at + SEARCH_BLOCK]
                kept[at : at + SEARCH_BLOCK] &= np.char.find(np.char.lower(block), text) >= 0
        return kept

    return keep
