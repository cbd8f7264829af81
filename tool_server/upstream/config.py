"""One ``mcpServers`` entry, checked: its transport (``StdioSpec``/``HttpSpec``) and our options.

Entries come in the JSON shapes the MCP clients use (Claude Desktop, Cursor, Cline/Roo,
VS Code's ``servers`` with ``type``); ``${NAME}``, ``${env:NAME}`` and ``${NAME:-default}``
are read from the environment. Every error is a ValueError that names the server and the key.

``${session}`` and ``${session_dir}`` are no environment variables: they stay in the spec
and ``for_session`` fills them in for each process of a ``per_session`` server (its
session's id, and a private directory that lives as long as the process).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CLIENT_ONLY_KEYS",
    "OPTION_KEYS",
    "HttpSpec",
    "StdioSpec",
    "SESSION_ID_PATTERN",
    "backoff",
    "byte_limit",
    "flag",
    "for_session",
    "interval",
    "parse_options",
    "parse_spec",
    "positive",
    "session_placeholders",
    "text",
]

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_REF = re.compile(r"(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)  # inside ${...}
# Filled in per process of a per_session server (for_session), not read from the environment.
_SESSION_REF = re.compile(r"\$\{(session|session_dir)\}")
# A session id that may stand in an argument or a path: no option (leading "-"), no "..", no "/".
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP")  # where Python, C and most tools put temporary files

_STDIO_KEYS = {"command", "args", "env", "envFile", "cwd"}
_HTTP_KEYS = {"url", "headers"}
_TYPE_KEYS = ("type", "transportType", "transport")  # VS Code/Cursor/Roo, Cline, older docs
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}
# Keys of the MCP clients' own UIs (tool approval, file watching): nothing to do for us.
CLIENT_ONLY_KEYS = frozenset({"autoApprove", "alwaysAllow", "watchPaths", "dev", "gallery", "version"})
# Our per-server keys, passed to UpstreamServer.
OPTION_KEYS = frozenset(
    {
        "namespace",
        "separator",
        "call_timeout_s",
        "connect_timeout_s",
        "restart_backoff",
        "health_interval_s",
        "required",
        "session_meta",
        "session_arg",
        "per_session",
        "session_uid",
        "max_sessions",
        "max_sessions_per_tenant",
        "max_message_bytes",
    }
)


@dataclass(frozen=True, slots=True)
class StdioSpec:
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    uid: int | None = None  # run the command as this uid (and gid): a per_session process's own


@dataclass(frozen=True, slots=True)
class HttpSpec:
    url: str
    headers: dict[str, str] = field(default_factory=dict)


def _expand(value: str, where: str) -> str:
    """Replace ``${NAME}`` (VS Code's ``${env:NAME}``, Claude Code's ``${NAME:-default}``)
    with the environment variable; any other ``${...}`` is refused, not passed on as text."""

    def sub(match: re.Match[str]) -> str:
        reference = match.group(0)
        if _SESSION_REF.fullmatch(reference):
            return reference  # a per-session value: for_session fills it in
        if reference.startswith("${input:"):
            raise ValueError(
                f"{where} uses a VS Code input variable ({reference}); the server cannot prompt "
                "for it: use ${NAME} and set the environment variable NAME"
            )
        parsed = _ENV_REF.fullmatch(match.group(1))
        if parsed is None:
            raise ValueError(
                f"{where} has {reference}, which names no environment variable: "
                "use ${NAME}, ${env:NAME} or ${NAME:-default}"
            )
        name, default = parsed.groups()
        found = os.environ.get(name)
        if default is not None and not found:  # unset or empty, as in a shell
            return default
        if found is None:
            raise ValueError(f"{where} refers to ${{{name}}}, but the environment variable {name} is not set")
        return found

    return _REFERENCE.sub(sub, value)


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{where} must be an object of strings, got {type(value).__name__}")
    return {k: _expand(str(v), f"{where}.{k}") for k, v in value.items()}


def _env_file(path: Any, where: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (Cursor's and VS Code's ``envFile``); ``#`` starts a comment."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where} must be a file path")
    try:
        text = Path(_expand(path, where)).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"{where}: cannot read {path!r}: {exc.strerror or exc}") from None
    env = {}
    for line in text.splitlines():
        key, sep, value = line.strip().removeprefix("export ").partition("=")
        if sep and key and not key.startswith("#"):
            env[key.strip()] = value.strip().strip("'\"")
    return env


def _transport_type(name: str, spec: dict[str, Any]) -> str:
    """``stdio`` or ``http``, from the entry's type key or, without one, its keys."""
    where = f"mcpServers.{name}"
    given = [spec[key] for key in _TYPE_KEYS if key in spec]
    kind = given[0] if given else None
    if kind is None and "url" in spec and "command" in spec:
        raise ValueError(f"{where} has both 'command' (stdio) and 'url' (HTTP); keep one")
    if kind == "sse":
        raise ValueError(f"{where}: the legacy SSE transport is not supported; use a streamable HTTP url")
    if kind in _HTTP_TYPES or (kind is None and "url" in spec):
        return "http"
    if kind == "stdio" or (kind is None and "command" in spec):
        return "stdio"
    if kind is None:
        raise ValueError(f"{where} needs 'command' (a stdio server) or 'url' (a streamable HTTP server)")
    raise ValueError(f"{where}.type must be stdio, http or streamable-http, got {kind!r}")


def parse_spec(name: str, spec: Any) -> StdioSpec | HttpSpec:
    """Validate the transport part of one ``mcpServers`` entry; the error names the server and key.

    Client-only keys (``autoApprove``...) are accepted here; ``load_upstreams`` warns about them.
    """
    where = f"mcpServers.{name}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object with 'command' (stdio) or 'url' (HTTP)")
    kind = _transport_type(name, spec)
    allowed = (_HTTP_KEYS if kind == "http" else _STDIO_KEYS) | set(_TYPE_KEYS) | CLIENT_ONLY_KEYS
    unknown = set(spec) - allowed
    if unknown:
        takes = "url, headers" if kind == "http" else "command, args, env, envFile, cwd"
        raise ValueError(f"{where} has unknown keys {sorted(unknown)} ({kind} entries take {takes})")
    if kind == "http":
        return _http_spec(where, spec)
    return _stdio_spec(where, spec)


def _http_spec(where: str, spec: dict[str, Any]) -> HttpSpec:
    url = spec.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.url must be an http(s) URL, got {url!r}")
    if urlsplit(url).path.rstrip("/").endswith("/sse") and not any(key in spec for key in _TYPE_KEYS):
        raise ValueError(
            f"{where}.url {url!r} ends in /sse, the legacy SSE transport, which is not supported: give "
            "the server's streamable HTTP URL (often .../mcp); if this one is streamable HTTP, say so "
            "with type: http"
        )
    return HttpSpec(_expand(url, f"{where}.url"), _str_map(spec.get("headers"), f"{where}.headers"))


def _stdio_spec(where: str, spec: dict[str, Any]) -> StdioSpec:
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError(f"{where}.command must be a non-empty string")
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise ValueError(f"{where}.args must be a list of strings")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"{where}.cwd must be a string")
    env = _env_file(spec["envFile"], f"{where}.envFile") if "envFile" in spec else {}
    env.update(_str_map(spec.get("env"), f"{where}.env"))
    return StdioSpec(
        command=_expand(command, f"{where}.command"),
        args=[_expand(str(a), f"{where}.args") for a in args],
        env=env,
        cwd=_expand(cwd, f"{where}.cwd") if cwd else None,
    )


def _values(spec: StdioSpec | HttpSpec) -> dict[str, str]:
    """Every string of ``spec`` by the key that holds it (``args[0]``, ``env.STATE_DIR``)."""
    if isinstance(spec, HttpSpec):
        return {"url": spec.url, **{f"headers.{k}": v for k, v in spec.headers.items()}}
    return {
        "command": spec.command,
        **{f"args[{i}]": arg for i, arg in enumerate(spec.args)},
        **{f"env.{k}": v for k, v in spec.env.items()},
        "cwd": spec.cwd or "",
    }


def session_placeholders(spec: StdioSpec | HttpSpec) -> list[str]:
    """The keys of ``spec`` that use ``${session}`` or ``${session_dir}``."""
    return [key for key, value in _values(spec).items() if _SESSION_REF.search(value)]


def for_session(spec: StdioSpec, session_id: str, directory: str) -> StdioSpec:
    """``spec`` for the process of one session: ``${session}`` and ``${session_dir}`` filled in,
    and its temporary files (``TMPDIR``, ``TMP``, ``TEMP``) in ``directory`` unless ``env`` sets them.

    ValueError when ``spec`` uses ``${session}`` and the id could be read as an option or as
    a path that leads elsewhere (``-x``, ``../x``, ``a/b``): only ``SESSION_ID_PATTERN`` ids fit.
    """
    with_id = [key for key, value in _values(spec).items() if "${session}" in value]
    if with_id and not SESSION_ID_PATTERN.fullmatch(session_id):
        raise ValueError(
            f"session id {session_id[:80]!r} cannot stand in ${{session}} ({', '.join(with_id)}): use "
            "session ids of letters, digits, '_', '-' and '.' that start with a letter, digit or '_'"
        )
    values = {"session": session_id, "session_dir": directory}

    def fill(value: str) -> str:
        return _SESSION_REF.sub(lambda match: values[match.group(1)], value)

    env = {key: fill(value) for key, value in spec.env.items()}
    for name in _TEMP_VARIABLES:
        env.setdefault(name, directory)
    return StdioSpec(
        command=spec.command,
        args=[fill(arg) for arg in spec.args],
        env=env,
        cwd=fill(spec.cwd) if spec.cwd else None,
    )


def positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{where} must be a positive number of seconds, got {value!r}")
    return float(value)


def byte_limit(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where} must be a positive whole number of bytes, got {value!r}")
    return value


def interval(value: Any, where: str) -> float | None:
    """Seconds between two probes, or None (null) for never."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{where} must be a positive number of seconds or null, got {value!r}")
    return float(value)


def backoff(value: Any, where: str) -> tuple[float, float]:
    """``[first, max]`` seconds between reconnects, with 0 < first <= max."""
    numbers = isinstance(value, list | tuple) and len(value) == 2
    numbers = numbers and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not numbers or not 0 < value[0] <= value[1]:
        raise ValueError(f"{where} must be [first, max] seconds with 0 < first <= max, got {value!r}")
    return float(value[0]), float(value[1])


def flag(value: Any, where: str) -> bool:
    """A YAML boolean: "no" or "false" in quotes would otherwise read as true."""
    if not isinstance(value, bool):
        raise ValueError(f"{where} must be true or false, got {value!r}")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value


def parse_options(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Our keys of one entry, plus what the clients' keys mean to us (``timeout``, ``disabledTools``)."""
    where = f"mcpServers.{name}"
    options = {key: entry.pop(key) for key in OPTION_KEYS & set(entry)}
    if "timeout" in entry:  # Cline/Roo: a call's timeout, in seconds
        timeout = positive(entry.pop("timeout"), f"{where}.timeout")
        if "call_timeout_s" in options:
            raise ValueError(f"{where} has both timeout and call_timeout_s; keep one")
        options["call_timeout_s"] = timeout
    disabled_tools = entry.pop("disabledTools", None) or []
    if not isinstance(disabled_tools, list) or not all(isinstance(t, str) for t in disabled_tools):
        raise ValueError(f"{where}.disabledTools must be a list of tool names")
    if disabled_tools:
        options["disabled_tools"] = disabled_tools
    return options
