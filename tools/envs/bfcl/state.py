"""BFCL's API instances as the records of a ``World``.

A BFCL multi-turn world is a handful of live objects (``GorillaFileSystem``,
``TradingBot``, ...), one per class a task involves. In our ``World`` they are the
records of one table, ``instances``, keyed by class name. A task's base holds each
class's *scenario* as plain JSON (``{"class", "config", "long_context"}``, BFCL's
``initial_config`` entry), so tasks stay serialisable; a session's first touch turns it
into a live instance the way BFCL's executor does (``_load_scenario`` on a deep copy of
the config), and an instance is copied with ``deepcopy``.

A record's comparable state is what BFCL's ``state_checker`` compares: the public
attributes (names not starting with ``_``), with its classes' equality (a ``File`` is its
name and content, a ``Directory`` its name and contents, never its parent). We write
that state as JSON-like data so ``World.digest`` can hash it.
"""

from __future__ import annotations

import copy
import importlib
from functools import cache
from typing import Any

from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES
from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import Directory, File

__all__ = ["TABLE", "StateOf", "api_class", "comparable", "copy_record", "load_instance", "scenario"]

TABLE = "instances"  # the World table holding one instance (or scenario) per class


@cache
def api_class(name: str) -> type:
    """The BFCL class ``name`` (imported from the package module BFCL maps it to)."""
    if name not in CLASS_FILE_PATH_MAPPING:
        raise ValueError(f"unknown BFCL API class {name!r}")
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)


def scenario(class_name: str, config: dict[str, Any], *, long_context: bool) -> dict[str, Any]:
    """The base record of one class in a task: JSON, turned into an instance on first touch."""
    return {"class": class_name, "config": config, "long_context": long_context}


def load_instance(record: dict[str, Any]) -> Any:
    """A live instance from a scenario record, initialised as BFCL's executor does."""
    instance = api_class(record["class"])()
    if record["class"] not in STATELESS_CLASSES:
        instance._load_scenario(copy.deepcopy(record["config"]), long_context=record["long_context"])
    # Long-context TravelAPI adds cards and bookings straight from its module's tables; a
    # copy keeps one session's writes to them out of every other session (and the module).
    # Only there: it costs 5x the load (tests check no other load shares an object).
    return copy.deepcopy(instance) if record["long_context"] else instance


def copy_record(record: Any) -> Any:
    """The ``World`` copier: a scenario becomes a fresh instance, an instance a deep copy."""
    return load_instance(record) if isinstance(record, dict) else copy.deepcopy(record)


def comparable(instance: Any) -> dict[str, Any]:
    """The state BFCL's state checker compares: public attributes, as JSON-like data."""
    return {name: _plain(value) for name, value in vars(instance).items() if not name.startswith("_")}


def _plain(value: Any) -> Any:
    """``value`` as data that is ``==`` exactly when BFCL's comparison says equal."""
    if isinstance(value, File):
        return {"file": value.name, "content": value.content}
    if isinstance(value, Directory):
        return {"directory": value.name, "contents": _plain(value.contents)}
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return {key: _plain(item) for key, item in value.items()}
        # JSON keys are strings: keep others (order ids are ints) as sorted pairs
        pairs = sorted(value.items(), key=lambda pair: repr(pair[0]))
        return {"__pairs__": [[key, _plain(item)] for key, item in pairs]}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)  # a tuple is not equal to a list in BFCL either
    if isinstance(value, set | frozenset):
        return {"__set__": sorted((_plain(item) for item in value), key=repr)}
    return value


class StateOf:
    """The ``World``'s ``record_state``: a record's comparable state.

    The state of a scenario record (the shared base) is computed once and kept: every
    comparison against an untouched or read-only record needs it.
    """

    def __init__(self) -> None:
        self._scenarios: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def __call__(self, record: Any) -> dict[str, Any]:
        if not isinstance(record, dict):
            return comparable(record)
        kept = self._scenarios.get(id(record))
        if kept is None or kept[0] is not record:
            kept = self._scenarios[id(record)] = (record, comparable(load_instance(record)))
        return kept[1]
