"""Rollout JSONL files for the workbench: where they may be, and a line index to page through them.

A trajectories file can hold 100k lines of several kilobytes each; the browser never gets
it whole. ``TrajectoryIndex`` reads a file once (then only what was appended since),
keeps each line's byte offset and a few summary fields, and answers filtered pages from
those; one trajectory is read back by seeking to its offset. The record format is the
one ``trainer-client rollout`` writes (its ``trajectory_record``), read as plain JSON:
the tool server never imports the trainer client.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = ["FileError", "Files", "TrajectoryIndex", "summary_of"]

UPLOAD_PREFIX = "upload:"
MAX_UPLOADS = 16  # per tenant: its oldest upload goes when another arrives
MAX_INDEXED_FILES = 8  # indexes kept in memory (one small tuple per line each)
MAX_LISTED_FILES = 2000


class FileError(ValueError):
    """A file the UI asked for is not one it may open; the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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
        if name.startswith(UPLOAD_PREFIX):
            path = self.uploads.get(tenant, {}).get(name)
            if path is None:
                raise FileError(f"no upload named {name!r} (uploads are kept while the server runs)", 404)
            return path
        if self.runs_dir is None:
            raise FileError(
                "this server has no runs directory (config: workbench.runs_dir); upload a file", 404
            )
        path = (self.runs_dir / name).resolve()
        if not path.is_relative_to(self.runs_dir):
            raise FileError(f"{name!r} is outside the runs directory", 403)
        if not path.is_file():
            raise FileError(f"no file {name!r} in the runs directory", 404)
        return path

    def listing(self, suffix: str, tenant: str) -> list[dict[str, Any]]:
        """Files ending in ``suffix`` under the runs directory (newest first), then the tenant's uploads."""
        found: list[tuple[float, str, int]] = []
        if self.runs_dir is not None and self.runs_dir.is_dir():
            for root, dirs, names in os.walk(self.runs_dir):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in names:
                    if name.endswith(suffix):
                        path = Path(root) / name
                        stat = path.stat()
                        found.append((stat.st_mtime, str(path.relative_to(self.runs_dir)), stat.st_size))
                if len(found) >= MAX_LISTED_FILES:
                    break
        found.sort(reverse=True)
        files = [{"name": name, "bytes": size, "mtime": mtime} for mtime, name, size in found]
        for name, path in reversed(self.uploads.get(tenant, {}).items()):
            files.append({"name": name, "bytes": path.stat().st_size, "mtime": path.stat().st_mtime})
        return files

    def add_upload(self, filename: str, body: bytes, tenant: str) -> str:
        """Keep an uploaded file for ``tenant``; its name for later requests."""
        base = Path(filename).name or "upload.jsonl"
        name = f"{UPLOAD_PREFIX}{uuid.uuid4().hex[:8]}/{base}"
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


ROW_FIELDS = (
    "id",
    "index",
    "sample",
    "data_source",
    "reward",
    "stop_reason",
    "num_turns",
    "tool_calls",
    "tool_errors",
    "tokens",
    "model_tokens",
    "error",
)
_AT = {name: n for n, name in enumerate(ROW_FIELDS)}
TAIL_BYTES = 256  # compared on every request: a file rewritten in place (a rerun) is indexed anew
MAX_CACHED_FILTERS = 8  # per file: a page turn under the same filters does not filter again


def summary_of(record: dict[str, Any]) -> dict[str, Any]:
    """The fields the trajectory list shows and filters on."""
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    mask = record.get("response_mask") or []
    reward = record.get("reward")
    return {
        "id": record.get("id"),
        "index": record.get("index"),
        "sample": record.get("sample"),
        "data_source": str(record.get("data_source") or "?"),
        "reward": reward if isinstance(reward, int | float) else None,
        "stop_reason": str(record.get("stop_reason")),
        "num_turns": record.get("num_turns"),
        "tool_calls": int(metrics.get("calls", 0) or 0),
        "tool_errors": int(metrics.get("tool_errors", 0) or 0),
        "tokens": len(mask),
        "model_tokens": _ones(mask),
        "error": record.get("error"),
    }


def _row(summary: dict[str, Any]) -> tuple[Any, ...]:
    """A summary as a tuple in ``ROW_FIELDS`` order, its repeated strings shared (100k rows: a fraction of the memory of dicts)."""
    values = [summary.get(name) for name in ROW_FIELDS]
    for name in ("data_source", "stop_reason"):
        values[_AT[name]] = sys.intern(values[_AT[name]])
    return tuple(values)


def _ones(mask: list[Any]) -> int:
    try:
        return int(sum(mask))  # 0/1 integers: summed in C (a 4k-token mask per line)
    except TypeError:
        return sum(1 for m in mask if m)


def _bad_line(number: int, exc: Exception) -> dict[str, Any]:
    return {"data_source": "?", "stop_reason": "unreadable", "error": f"line {number + 1}: {exc}"[:300]}


@dataclass
class _Index:
    size: int = 0  # bytes indexed so far (whole lines only)
    mtime_ns: int = 0
    inode: int = 0
    tail: bytes = b""  # the last bytes indexed: still there if the file only grew
    offsets: list[int] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)  # ROW_FIELDS of each line
    # kept up to date as lines are indexed, so that no request walks every row for them
    facets: dict[str, Counter[str]] = field(
        default_factory=lambda: {"data_source": Counter(), "stop_reason": Counter()}
    )
    groups: dict[tuple[Any, Any], list[int]] = field(default_factory=dict)  # (data_source, index) -> lines
    # filters -> (rows filtered so far, matching lines); extended, not redone, when the file grows
    matches: OrderedDict[tuple[tuple[str, str], ...], tuple[int, list[int]]] = field(
        default_factory=OrderedDict
    )

    def add(self, offset: int, summary: dict[str, Any]) -> None:
        row = _row(summary)
        line = len(self.rows)
        self.offsets.append(offset)
        self.rows.append(row)
        self.facets["data_source"][row[_AT["data_source"]]] += 1
        self.facets["stop_reason"][row[_AT["stop_reason"]]] += 1
        if row[_AT["index"]] is not None:
            self.groups.setdefault((row[_AT["data_source"]], row[_AT["index"]]), []).append(line)

    def matching(self, filters: dict[str, str]) -> list[int]:
        """Lines whose rows pass ``filters``; only rows indexed since the last same request are filtered."""
        key = tuple(sorted((k, v) for k, v in filters.items() if k in FILTER_KEYS and v != ""))
        keep = _row_filter(filters)  # checks the values too (a FileError names a bad one)
        done, lines = self.matches.pop(key, (0, []))
        if done < len(self.rows):
            lines = lines + [n for n in range(done, len(self.rows)) if keep(self.rows[n])]
        self.matches[key] = (len(self.rows), lines)
        while len(self.matches) > MAX_CACHED_FILTERS:
            self.matches.popitem(last=False)
        return lines


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
    """Per-file line offsets and summaries, built once and extended when the file grows.

    Blocking (file reads, JSON parsing): call it from a worker thread.
    """

    def __init__(self) -> None:
        self._indexes: OrderedDict[Path, _Index] = OrderedDict()
        self._lock = threading.Lock()  # one builder at a time; a second request waits for it

    def index(self, path: Path) -> _Index:
        with self._lock:
            stat = path.stat()
            index = self._indexes.get(path)
            if index is None or not _only_grew(path, stat, index):  # new, or replaced, or rewritten
                index = _Index(inode=stat.st_ino)
            if stat.st_size != index.size or stat.st_mtime_ns != index.mtime_ns:
                self._extend(path, index)
                index.mtime_ns = stat.st_mtime_ns
            self._indexes[path] = index
            self._indexes.move_to_end(path)
            while len(self._indexes) > MAX_INDEXED_FILES:
                self._indexes.popitem(last=False)
            return index

    @staticmethod
    def _extend(path: Path, index: _Index) -> None:
        with open(path, "rb") as handle:
            handle.seek(index.size)
            offset = index.size
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # a line still being written: indexed once it is complete
                if line.strip():
                    try:
                        record = orjson.loads(line)
                        summary = (
                            summary_of(record)
                            if isinstance(record, dict)
                            else _bad_line(len(index.rows), TypeError("not an object"))
                        )
                    except orjson.JSONDecodeError as exc:
                        summary = _bad_line(len(index.rows), exc)
                    index.add(offset, summary)
                offset += len(line)
            index.size = offset
            handle.seek(max(0, offset - TAIL_BYTES))
            index.tail = handle.read(offset - max(0, offset - TAIL_BYTES))

    def page(self, path: Path, filters: dict[str, str], offset: int, limit: int) -> dict[str, Any]:
        """``limit`` rows from ``offset`` among those matching ``filters``, and the facets of the file."""
        index = self.index(path)
        with self._lock:  # the cached matches are shared between requests
            matching = index.matching(filters)
        rows = [
            {"line": n, **dict(zip(ROW_FIELDS, index.rows[n], strict=True))}
            for n in matching[offset : offset + limit]
        ]
        return {
            "total": len(index.rows),
            "matching": len(matching),
            "offset": offset,
            "rows": rows,
            "facets": {name: dict(counts.most_common(50)) for name, counts in index.facets.items()},
        }

    def record(self, path: Path, line: int) -> dict[str, Any]:
        """The record on (0-based, non-empty) line ``line``."""
        index = self.index(path)
        if not 0 <= line < len(index.offsets):
            raise FileError(f"no trajectory {line} (the file has {len(index.offsets)})", 404)
        with open(path, "rb") as handle:
            handle.seek(index.offsets[line])
            raw = handle.readline()
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise FileError(f"trajectory {line} is not valid JSON: {exc}", 422) from None
        if not isinstance(record, dict):
            raise FileError(f"trajectory {line} is not a JSON object", 422)
        return record

    def siblings(self, path: Path, line: int) -> list[int]:
        """Lines of the other samples of the same prompt (a GRPO group)."""
        index = self.index(path)
        row = index.rows[line]
        if row[_AT["index"]] is None:
            return []
        group = index.groups.get((row[_AT["data_source"]], row[_AT["index"]]), [])
        return [n for n in group if n != line]


FILTER_KEYS = ("data_source", "stop_reason", "min_reward", "max_reward", "tool_errors", "q")


def _number(filters: dict[str, str], key: str) -> float | None:
    raw = filters.get(key)
    if raw in (None, ""):
        return None
    try:
        return float(raw)  # type: ignore[arg-type]
    except ValueError:
        raise FileError(f"{key} must be a number, got {raw!r}") from None


def _row_filter(filters: dict[str, str]) -> Any:
    source = filters.get("data_source") or None
    stop = filters.get("stop_reason") or None
    low, high = _number(filters, "min_reward"), _number(filters, "max_reward")
    errors = filters.get("tool_errors") or None
    if errors not in (None, "yes", "no"):
        raise FileError(f"tool_errors must be 'yes' or 'no', got {errors!r}")
    text = (filters.get("q") or "").lower()

    at_source, at_stop, at_reward = _AT["data_source"], _AT["stop_reason"], _AT["reward"]
    at_errors, at_id = _AT["tool_errors"], _AT["id"]

    def keep(row: tuple[Any, ...]) -> bool:
        if source is not None and row[at_source] != source:
            return False
        if stop is not None and row[at_stop] != stop:
            return False
        reward = row[at_reward]
        if low is not None and (reward is None or reward < low):
            return False
        if high is not None and (reward is None or reward > high):
            return False
        if errors is not None and ((row[at_errors] or 0) > 0) != (errors == "yes"):
            return False
        return not text or text in str(row[at_id] or "").lower()

    return keep
