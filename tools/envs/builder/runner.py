"""The program that runs generated tool code inside a sandbox worker (standard library only).

This file is never imported by the builder or the server: ``sandboxed.py`` sends its
source text to a confined ``SandboxWorker`` together with a JSON request on the worker's
stdin, and reads one JSON reply back as the value of the final expression. The generated
code is ``exec``-ed here, i.e. only inside the confined child process.

Request (JSON on stdin)::

    {"mode": "call", "source": "<module text>", "tool": "name", "arguments": {...},
     "tables": {"table": {"key": record}}, "error_kinds": ["tool_error", ...]}
    {"mode": "check", "source": "<module text>", "tools": ["name", ...]}

Reply (JSON text)::

    {"ok": true, "output": <JSON>, "changes": {"table": {"key": record | null}}}
    {"ok": false, "kind": "tool_error" | "invalid_arguments" | "crash", "error": "<message>"}
    {"ok": true, "parameters": {"name": ["world", "arg", ...]}}     (mode "check")

``changes`` lists the records the call created, changed (the new record) or deleted
(null): the world goes in as JSON and only the difference comes out.
"""

import contextlib
import inspect
import io
import json
import sys
import traceback
import types


class ToolError(Exception):
    """The sandbox's stand-in for ``protocol.ToolError`` (the real package is not visible here)."""

    def __init__(self, message, kind="tool_error"):
        super().__init__(message)
        self.kind = str(getattr(kind, "value", kind))
        self.message = message


class Table(dict):
    """One table of the world: a dict of records by key (``peek`` as on the server's tables)."""

    def peek(self, key, default=None):
        return self.get(key, default)


class World:
    """The tables the call may use; asking for another one is a KeyError naming the known ones."""

    def __init__(self, tables):
        self._tables = {name: Table(records) for name, records in tables.items()}

    def __getitem__(self, name):
        if name not in self._tables:
            raise KeyError(f"no table {name!r} for this tool (tables: {', '.join(sorted(self._tables))})")
        return self._tables[name]

    def __contains__(self, name):
        return name in self._tables

    def table_names(self):
        return sorted(self._tables)


def _protocol_shim(kinds):
    """A ``protocol`` module with ToolError and ErrorKind, for code that imports them."""
    module = types.ModuleType("protocol")
    module.ToolError = ToolError
    module.ErrorKind = type("ErrorKind", (), {kind.upper(): kind for kind in kinds})
    return module


def _load(source, kinds):
    shim = _protocol_shim(kinds)
    sys.modules["protocol"] = shim
    namespace = {"__name__": "built_tools", "ToolError": ToolError, "ErrorKind": shim.ErrorKind}
    exec(compile(source, "built_tools.py", "exec"), namespace)  # noqa: S102 - inside the sandbox only
    return namespace


def _changes(before, world):
    out = {}
    for name, records in world._tables.items():
        old = before[name]
        table = {}
        for key, record in records.items():
            text = json.dumps(record, sort_keys=True)
            if old.get(key) != text:
                table[str(key)] = json.loads(text)
        for key in old:
            if key not in records:
                table[key] = None
        if table:
            out[name] = table
    return out


def _error(kind, message):
    return {"ok": False, "kind": kind, "error": str(message)[:2000]}


def _call(request):
    namespace = _load(request["source"], request.get("error_kinds", ["tool_error"]))
    function = namespace.get(request["tool"])
    if not callable(function):
        return _error("crash", f"the tool source defines no function {request['tool']!r}")
    tables = request["tables"]
    before = {
        name: {k: json.dumps(r, sort_keys=True) for k, r in recs.items()} for name, recs in tables.items()
    }
    world = World(json.loads(json.dumps(tables)))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            output = function(world, **request["arguments"])
    except ToolError as exc:
        return _error(exc.kind, exc.message)
    except TypeError as exc:
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
            return _error("invalid_arguments", exc)  # raised by the call itself: wrong argument names
        return _error("crash", "".join(traceback.format_exception_only(exc)).strip())
    except Exception as exc:
        return _error("crash", "".join(traceback.format_exception_only(exc)).strip())
    try:
        output = json.loads(json.dumps(output))
        changes = _changes(before, world)
    except (TypeError, ValueError) as exc:
        return _error("crash", f"the tool returned or stored something that is not JSON: {exc}")
    return {"ok": True, "output": output, "changes": changes}


def _check(request):
    namespace = _load(request["source"], ["tool_error"])
    parameters = {}
    for name in request["tools"]:
        function = namespace.get(name)
        if not inspect.isfunction(function):
            return _error("crash", f"the source defines no function {name!r}")
        parameters[name] = list(inspect.signature(function).parameters)
    return {"ok": True, "parameters": parameters}


def _tf_main():
    request = json.loads(sys.stdin.read())
    try:
        reply = _call(request) if request["mode"] == "call" else _check(request)
    except Exception as exc:  # the module itself failed to load
        reply = _error("crash", "".join(traceback.format_exception_only(exc)).strip())
    return json.dumps(reply)
