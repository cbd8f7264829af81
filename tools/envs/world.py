"""A session's world: copy-on-write tables over a base state shared by every session.

Thousands of concurrent trajectories of one environment must not each copy its
database (the τ² airline DB is ~7 MB of records). A ``World`` keeps one private
*overlay* per table; the base tables are shared and never written. A record is copied
into the overlay the first time the session touches it (reads included: a tool may
mutate what it reads, so a read hands out the session's own copy), so a session costs
the records it touched, not the database. ``peek`` reads without copying, for code that
promises not to mutate.

``World.calls`` is the session's call log: what was called, with which arguments, and
what came back. The ``tool_use`` verifier scores from it (the server's record of what
ran, not a re-parse of the model's text). ``World.refused`` keeps, apart from it, the calls
the server refused on the tool's schema before they reached the world: a benchmark that
checks no schema (τ²) would have run them, and its own verdict replays them.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["CallRecord", "RefusedCall", "Table", "World", "jsonable"]

_DELETED = object()  # overlay marker: the record exists in the base but not in this world


@dataclass
class CallRecord:
    """One call a session made to an environment tool (``error`` set when it failed)."""

    name: str
    arguments: dict[str, Any]
    output: Any = None
    error: str | None = None


@dataclass
class RefusedCall:
    """A call refused before it reached the world: its arguments broke the tool's schema.

    Nothing ran, so the log (``World.calls``) leaves it out; ``position`` is where it came in
    the log (how many logged calls were before it), ``requestor`` who made it (τ²'s
    ``assistant`` or ``user``), ``record.error`` what the caller was told.
    """

    position: int
    record: CallRecord
    requestor: str


class Table(MutableMapping[str, Any]):
    """One table of a world: ``base`` (shared, read-only) under a private overlay."""

    __slots__ = ("_base", "_copy", "_overlay")

    def __init__(self, base: Mapping[str, Any], copier: Callable[[Any], Any]) -> None:
        self._base = base
        self._copy = copier
        self._overlay: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._overlay:
            value = self._overlay[key]
            if value is _DELETED:
                raise KeyError(key)
            return value
        value = self._copy(self._base[key])  # KeyError when absent from both
        self._overlay[key] = value
        return value

    def peek(self, key: str, default: Any = None) -> Any:
        """The record without copying it: for reading only, never mutate what this returns."""
        if key in self._overlay:
            value = self._overlay[key]
            return default if value is _DELETED else value
        return self._base.get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self._overlay[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        if key in self._base:
            self._overlay[key] = _DELETED
        else:
            del self._overlay[key]

    def __contains__(self, key: object) -> bool:
        if key in self._overlay:
            return self._overlay[key] is not _DELETED
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        for key in self._base:
            if self._overlay.get(key) is not _DELETED:
                yield key
        for key in self._overlay:
            if key not in self._base and self._overlay[key] is not _DELETED:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def touched(self) -> set[str]:
        """Keys this world copied, wrote or deleted (everything else is the base's)."""
        return set(self._overlay)

    def base_record(self, key: str, default: Any = None) -> Any:
        """The shared base's record (never mutate it)."""
        return self._base.get(key, default)


@dataclass
class World:
    """The tables of one session (or one replay of a task's gold calls).

    ``base`` maps table names to ``{key: record}``; records may be any objects (dicts,
    pydantic models, class instances). ``copier`` copies one record (``copy.deepcopy``
    by default); ``record_state`` turns a record into something comparable with ``==``
    (identity by default; an importer whose records are plain objects supplies one).
    """

    base: Mapping[str, Mapping[str, Any]]
    copier: Callable[[Any], Any] = copy.deepcopy
    record_state: Callable[[Any], Any] | None = None
    calls: list[CallRecord] = field(default_factory=list)
    refused: list[RefusedCall] = field(default_factory=list)  # refused on the schema, never ran
    _tables: dict[str, Table] = field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            if name not in self.base:
                raise KeyError(f"no table {name!r} in this world (tables: {', '.join(sorted(self.base))})")
            table = self._tables[name] = Table(self.base[name], self.copier)
        return table

    def table_names(self) -> list[str]:
        return sorted(set(self.base) | set(self._tables))

    def _state(self, record: Any) -> Any:
        return self.record_state(record) if self.record_state is not None else record

    def touched(self) -> set[tuple[str, str]]:
        """(table, key) of every record this world copied, wrote or deleted."""
        return {(name, key) for name, table in self._tables.items() for key in table.touched()}

    def changed(self) -> set[tuple[str, str]]:
        """(table, key) of every record whose state differs from the base (read-only copies are not)."""
        out = set()
        for name, key in self.touched():
            table = self._tables[name]
            mine, base = table.peek(key, _DELETED), table.base_record(key, _DELETED)
            if (mine is _DELETED) != (base is _DELETED) or (
                mine is not _DELETED and self._state(mine) != self._state(base)
            ):
                out.add((name, key))
        return out

    def differences(self, other: World) -> list[tuple[str, str]]:
        """(table, key) of records whose state differs between two worlds over the same base.

        Only records that one of them changed can differ, so this costs what the two
        sessions touched, not the size of the database.
        """
        if other.base is not self.base:
            raise ValueError("worlds over different base states cannot be compared record by record")
        differ = []
        for name, key in sorted(self.changed() | other.changed()):
            mine, theirs = self[name].peek(key, _DELETED), other[name].peek(key, _DELETED)
            if mine is _DELETED or theirs is _DELETED:
                if mine is not theirs:
                    differ.append((name, key))
            elif self._state(mine) != self._state(theirs):
                differ.append((name, key))
        return differ

    def matching_fraction(self, other: World) -> float:
        """Share of the records either world changed that end in the same state (1.0: none differ)."""
        changed = self.changed() | other.changed()
        if not changed:
            return 1.0
        return 1.0 - len(self.differences(other)) / len(changed)

    def digest(self) -> str:
        """A hash of this world's state as changes to its base: equal states, equal digests."""
        changes = []
        for name, key in sorted(self.changed()):
            value = self[name].peek(key, _DELETED)
            deleted = value is _DELETED
            changes.append([name, key, None if deleted else self._state(value), deleted])
        blob = orjson.dumps(changes, default=jsonable, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(blob).hexdigest()


def jsonable(value: Any) -> Any:
    """JSON for a record that is not plain data: a pydantic model's dump, an object's public attributes."""
    dump = getattr(value, "model_dump", None)  # pydantic records
    if callable(dump):
        return dump(mode="json")
    if hasattr(value, "__dict__"):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)
