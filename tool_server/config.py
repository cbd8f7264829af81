"""Server configuration: one YAML file, every key overridable from the environment.

Environment overrides use ``TOOLFACTORY__`` plus the key path in upper case joined
by double underscores, e.g. ``TOOLFACTORY__LIMITS__MAX_CONCURRENCY=512`` or
``TOOLFACTORY__AUTH__TOKENS_FILE=/run/secrets/tokens``. Values are parsed as YAML
scalars, so numbers and booleans keep their type.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import yaml

import tools  # noqa: F401  (registers the old paths of moved tool modules: protocol.moved)
from protocol.moved import current_name
from protocol.tool import get_tool_meta

DEFAULT_CONFIG_PATH = Path(__file__).parent / "configs" / "default.yaml"
ENV_PREFIX = "TOOLFACTORY__"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and what is expected."""


@dataclass
class LimitsConfig:
    max_concurrency: int = 512  # tool calls running at once, all tools together
    max_queue: int = 16384  # calls admitted but waiting for a slot; beyond it: overloaded / 429
    # admitted calls one token (tenant) may hold; over it only its batches get a 429. None: 3/4 of
    # max_concurrency + max_queue (the whole of it for a server without tokens: one tenant)
    max_admitted_per_tenant: int | None = None
    max_calls_per_batch: int = 4096  # calls in one /v1/calls POST
    max_request_bytes: int = 16 * 1024 * 1024  # body size limit for every endpoint
    # Bytes of calls bodies (/v1/calls and /v1/verify bodies, stream frames) admitted and not yet
    # answered (tool_server/api/queued_bytes.py); beyond a bound the body is refused whole:
    # overloaded / 429. Each bound at least max_request_bytes.
    max_queued_bytes: int = 1024 * 1024 * 1024  # all together
    max_queued_bytes_per_tenant: int | None = None  # one token; None: 3/4 of it (all without tokens)
    max_queued_bytes_per_connection: int = 64 * 1024 * 1024  # one stream's frames in flight
    max_output_chars: int = 32768  # text returned per call; longer output is truncated with a marker
    max_structured_bytes: int = 1024 * 1024  # structured output per call; larger is dropped with a note
    # Images in a result (MCP image content, PNG or JPEG): one over a limit makes the call a
    # too_large error the model sees (an image cannot be cut like text). Sizes come from the header.
    max_image_bytes: int = 4 * 1024 * 1024  # one image, decoded
    max_image_pixels: int = 2048 * 2048  # one image, width x height
    max_images_per_result: int = 8
    default_timeout_s: float = 30.0  # per-call timeout for tools that do not set their own
    max_timeout_s: float = 600.0  # ceiling on any tool's timeout
    thread_pool_size: int = 32  # worker threads for blocking (sync) tools
    retry_after_s: int = 1  # Retry-After header sent with a 429


@dataclass
class IdempotencyConfig:
    ttl_s: float = 900.0  # how long a finished call_id's result is kept for retries
    max_entries: int = 200_000
    max_bytes: int = 256 * 1024 * 1024  # estimated memory of kept results; the oldest go first


@dataclass
class CacheConfig:
    enabled: bool = True  # result cache for tools marked cacheable
    max_entries: int = 50_000
    ttl_s: float = 3600.0
    max_bytes: int = 128 * 1024 * 1024  # estimated memory of cached results; the oldest go first


@dataclass
class SessionsConfig:
    # Idle time after which a session is closed: a call or a renewal (POST /v1/sessions/renew,
    # sent by the trainer client for live trajectories every ttl_s / 3) restarts it.
    ttl_s: float = 900.0
    max_sessions: int = 10_000
    # Open sessions one token (tenant) may hold. None: 3/4 of max_sessions (all of them for a
    # server without tokens: one tenant)
    max_sessions_per_tenant: int | None = None
    sweep_interval_s: float = 10.0


@dataclass
class AuthConfig:
    tokens_env: str = "TOOLFACTORY_TOKENS"  # "tok1" or "tok1:toolsetA+toolsetB" entries, comma separated
    tokens_file: str | None = None  # one entry per line, same syntax; '#' starts a comment
    public_paths: list[str] = field(default_factory=lambda: ["/healthz", "/readyz"])


@dataclass
class McpConfig:
    enabled: bool = True
    allowed_hosts: list[str] = field(default_factory=list)  # extra Host values (e.g. "tools.internal:*")
    allowed_origins: list[str] = field(default_factory=list)  # extra Origin values for browser clients
    server_name: str = "toolfactory"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    insecure: bool = False  # allow a non-loopback bind without auth tokens
    # Host names (besides the loopback names and the bound addresses) requests may carry:
    # "name" (any port) or "name:port"; "*" (only with tokens): any. Others get 421 (DNS rebinding).
    allowed_hosts: list[str] = field(default_factory=list)
    # Serve untrusted code (python, code_tests, built packs) beyond loopback even when the
    # sandbox could only set up its weak fallback (no mount namespace or no uid of its own).
    allow_weak_sandbox: bool = False
    shutdown_grace_s: float = 20.0  # in-flight calls get this long to finish on SIGTERM
    log_level: str = "info"
    # Allocations between young-generation garbage collections (Python's default: 700).
    # Every call allocates a few short-lived dicts, so the default collects thousands of
    # times a second; 0 keeps Python's default.
    gc_threshold: int = 200_000
    # Slow or stalled clients (tool_server/api/connections.py): each holds an fd until closed.
    header_timeout_s: float = 10.0  # request headers must be complete within this; else 408, close
    body_timeout_s: float = 30.0  # the whole body must arrive within this of the headers; else 408
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    # Open connections at most (lowered to fit the open-files limit). At the cap a new one
    # evicts the longest-idle connection; if all have requests in progress it gets a 503.
    max_connections: int = 8192
    # Open /v1/stream connections one token may hold; beyond, its handshake gets 429. None: 3/4 of
    # max_connections (all of them without tokens). At the cap, idle streams are evicted (1013)
    # before a new connection is refused.
    max_streams_per_tenant: int | None = None
    # After this long with no call admitted, hand freed heap memory back to the OS (glibc's
    # malloc_trim; Python keeps what it freed otherwise). 0: never.
    memory_trim_idle_s: float = 10.0


@dataclass
class ToolSpec:
    """One tool (or verifier) entry: an import path plus overrides of its metadata."""

    target: str  # "package.module:function" or "package.module:Class"
    name: str | None = None  # defaults to the tool's own name
    args: dict[str, Any] = field(default_factory=dict)  # constructor kwargs for a class
    # Not given: the default toolset (default_toolset), so a new tool is on /mcp and /v1/tools
    # as a newcomer expects; [] puts it in none (callable by name, listed under toolset=*).
    toolsets: list[str] | None = None
    timeout_s: float | None = None
    max_concurrency: int | None = None
    cacheable: bool | None = None
    description: str | None = None
    enabled: bool = True


@dataclass
class EnvironmentSpec:
    """One environment pack served as a toolset: a pack directory, or a source that builds one."""

    path: str | None = None  # a pack directory (pack.yaml, state.json, tasks.jsonl)
    source: str | None = None  # "package.module:callable" returning a Pack, called with `arguments`
    arguments: dict[str, Any] = field(default_factory=dict)
    toolset: str | None = None  # the toolset (and /mcp/<toolset>) of its tools; default: the pack id
    # Served tool names are prefix + the pack's names: two packs with the same tool names
    # (tau2 airline and retail) can share a server. Build their data with the same prefix.
    prefix: str = ""
    timeout_s: float | None = None  # per call (default: limits.default_timeout_s)
    enabled: bool = True

    def ref(self) -> str:
        """The directory or source, checked: exactly one of ``path`` and ``source``."""
        if (self.path is None) == (self.source is None):
            raise ConfigError(f"environments entry {self}: give exactly one of 'path' and 'source'")
        return str(self.path if self.path is not None else self.source)


@dataclass
class RetrieveConfig:
    """The Search-R1 compatible ``POST /retrieve`` endpoint, served by a search tool."""

    tool: str | None = "search"  # None disables the endpoint
    default_topk: int = 3


@dataclass
class WorkbenchConfig:
    """The web UI at ``/ui`` (tool_server/workbench/routes.py)."""

    enabled: bool = True
    # Rollout JSONL files and training runs (their metrics.jsonl) the UI may open; paths
    # outside it are refused. None: uploaded files only.
    runs_dir: str | None = None
    # A tokenizer (tokenizer.json, or a directory holding one) to show each token's text in a
    # trajectory; without one the UI shows token ids inside each decoded segment.
    tokenizer: str | None = None
    # The trajectory index (tool_server/workbench/files.py, ~110 bytes a line): lines indexed
    # per file (later ones are not listed, and the page says so), and the memory of all files'
    # indexes together (the least recently used go first; a file that alone needs more is
    # indexed up to it). At least 1 MiB.
    index_max_lines: int = 1_000_000
    index_max_bytes: int = 256 * 1024 * 1024


@dataclass
class SandboxConfig:
    """Python sandbox workers of this replica. As root each worker runs as a uid of its own;
    replicas on one node must draw from disjoint ranges (docs/scaling.md, "Sandbox uids")."""

    uid_range: str = "200000-299999"  # FIRST-LAST, inclusive; split below among the replicas of a node
    replicas: int = 1  # replicas on one node sharing uid_range (each takes an equal slice)
    # This replica's slice, 0 .. replicas-1 (e.g. a StatefulSet ordinal); null: the first slice
    # no live server has claimed in claims_dir (pods of a Deployment sharing a node's directory).
    replica_index: int | None = 0
    claims_dir: str | None = None  # e.g. /run/toolfactory-uids: refuse to start on an overlapping live claim

    def uids(self) -> range:
        """This replica's uids (the whole range when the slice is picked at start); ConfigError
        when the range or the slice is invalid."""
        from tools.sandbox.uids import parse_uid_range, replica_slice

        try:
            if self.replica_index is None and self.claims_dir is None:
                raise ValueError("sandbox.replica_index null (pick a free slice) needs sandbox.claims_dir")
            uids = parse_uid_range(self.uid_range)
            mine = replica_slice(uids, self.replica_index or 0, self.replicas)  # checks replicas too
            return mine if self.replica_index is not None else uids
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    idempotency: IdempotencyConfig = field(default_factory=IdempotencyConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    retrieve: RetrieveConfig = field(default_factory=RetrieveConfig)
    workbench: WorkbenchConfig = field(default_factory=WorkbenchConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tools: list[ToolSpec] = field(default_factory=list)
    verifiers: list[ToolSpec] = field(default_factory=list)
    toolsets: dict[str, list[str]] = field(default_factory=dict)  # extra named subsets of tool names
    environments: list[EnvironmentSpec] = field(default_factory=list)  # packs served as stateful toolsets
    default_toolset: str | None = "default"  # what /mcp and /v1/tools list; None = all tools
    mcpServers: dict[str, dict[str, Any]] = field(default_factory=dict)  # noqa: N815 (the MCP clients' key)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # VS Code's name for mcpServers
    # Upstream tools appear as "<server><sep><tool>"; "__" keeps OpenAI's ^[a-zA-Z0-9_-]{1,64}$.
    upstream_separator: str = "__"
    extends: str | None = None  # "builtin" or a path: start from that file, then apply this one


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Build a dataclass field value from YAML data, with errors that name the key."""
    origin = getattr(annotation, "__origin__", None)
    if is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return _build(annotation, value, where)
    if origin is list:
        (item_type,) = annotation.__args__
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        return [_coerce(v, item_type, _item_where(v, where, i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return value
    if annotation in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if annotation is float and isinstance(value, int):
        return float(value)
    if annotation in (int, float, str, bool) and not isinstance(value, annotation):
        raise ConfigError(f"{where}: expected {annotation.__name__}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(
            f"{where or 'config'}: unknown key(s) {sorted(unknown)}; known keys: {sorted(known)}"
        )
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if data.get(name) is None]
    if missing:
        raise ConfigError(f"{where or 'config'}: missing key(s) {missing}{_MISSING_HINTS.get(cls, '')}")
    kwargs = {}
    for key, value in data.items():
        annotation = hints[key]
        # Optional[X] → X when a value is present
        args = getattr(annotation, "__args__", ())
        if value is not None and type(None) in args and len(args) == 2:
            annotation = next(a for a in args if a is not type(None))
        path = f"{where}.{key}" if where else key
        kwargs[key] = None if value is None else _coerce(value, annotation, path)
    return cls(**kwargs)


_MISSING_HINTS: dict[type, str] = {
    ToolSpec: " (the tool's import path, e.g. target: my_package.tools:lookup)",
}


class _Located(dict):  # type: ignore[type-arg]
    """A mapping read from a config file that knows where: ``file:line``, for error messages."""

    where: str | None = None


def _located(mapping: dict[str, Any], where: str | None) -> dict[str, Any]:
    located = _Located(mapping)
    located.where = where
    return located


def _where_of(value: Any) -> str | None:
    return value.where if isinstance(value, _Located) else None


def _item_where(value: Any, where: str, index: int) -> str:
    """A list item's place in messages: the user's file and line when it came from one (an
    index into a merged list names a position the user never wrote)."""
    located = _where_of(value)
    return f"{located}: {where}" if located else f"{where}[{index}]"


def _yaml_loader(source: Path) -> type[yaml.SafeLoader]:
    """A safe loader whose mappings remember their line in ``source``."""

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[str, Any]:
        return _located(loader.construct_mapping(node, deep=True), f"{source}:{node.start_mark.line + 1}")

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def _apply_env(data: dict[str, Any], environ: dict[str, str]) -> None:
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        if path[0] == "mcpservers":
            path[0] = "mcpServers"
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {part} is not a mapping in the config")
        node[path[-1]] = yaml.safe_load(raw) if raw != "" else None


# Lists of tool entries merge entry by entry (by name, else by target) instead of being replaced.
MERGED_LISTS = ("tools", "verifiers")


def _merge(
    base: dict[str, Any], override: dict[str, Any], replace: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Deep-merge mappings; scalars and plain lists in ``override`` replace the base's.

    ``tools`` and ``verifiers`` (at the top level) merge entry by entry (``_merge_entries``).
    A file lists them in ``replace: [tools]`` to replace the base's list instead.
    """
    merged = dict(base)
    for key, value in override.items():
        if (
            key in MERGED_LISTS
            and key not in replace
            and isinstance(merged.get(key), list)
            and isinstance(value, list)
        ):
            merged[key] = _merge_entries(merged[key], value, key)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _target_key(target: Any) -> str | None:
    """A target with a moved module's old path read as the new one (both name one tool)."""
    if not isinstance(target, str):
        return None
    module, sep, attribute = target.partition(":")
    return current_name(module) + sep + attribute


def _served_name(entry: dict[str, Any]) -> str | None:
    """The name a base entry's tool is served under: its ``name``, else the name its target
    gives itself (``@tool(name=...)``, else the function or class name), as the registry
    derives it. None when the target does not import: nothing can name it then."""
    if entry.get("name"):
        return str(entry["name"])
    target = _target_key(entry.get("target"))
    if target is None:
        return None
    module_name, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return get_tool_meta(found).name or getattr(found, "__name__", None)


def _merge_entries(base: list[Any], override: list[Any], key: str = "tools") -> list[Any]:
    """The base's entries updated by the file's, in place; the file's other entries added.

    A file's entry updates the base entry serving the tool it names (``name: sql``; a built-in
    entry has no ``name``, so its tool's own name counts), else the one with its ``target``
    (then a ``name`` renames it). Each base entry is updated by one entry of the file at most:
    a second entry with the same target is a second tool. ``enabled: false`` drops a tool.
    """
    merged = list(base)
    served: dict[int, str | None] = {}  # base position -> served name, imported on first need
    claimed: set[int] = set()
    for entry in override:
        position = _base_position(base, entry, served, claimed, key) if isinstance(entry, dict) else None
        if position is None:
            if isinstance(entry, dict) and (entry.get("target") is None or entry.get("enabled") is False):
                _refuse_unmatched(base, entry, key)
            merged.append(entry)
            continue
        claimed.add(position)
        where = _where_of(entry) or _where_of(base[position])  # the user's line, for error messages
        merged[position] = _located({**base[position], **entry}, where)
    return merged


def _refuse_unmatched(base: list[Any], entry: dict[str, Any], key: str) -> None:
    """An entry that can only change a base entry (no target, or ``enabled: false``) but
    matches none: say so, rather than add a tool that cannot load or drops nothing."""
    known = sorted(filter(None, (_served_name(e) for e in base if isinstance(e, dict))))
    what = (
        f"no tool named {entry['name']!r}"
        if entry.get("name")
        else f"no tool with target {entry.get('target')}"
    )
    raise ConfigError(
        f"{_where_of(entry) or key}: this {key} entry changes a tool of the base file, but the base "
        f"serves {what} (its {key}: {', '.join(known) or 'none'}). Name one of those (name: or target:) "
        "to change or drop it, or give a target (and no enabled: false) to add a new one"
    )


def _base_position(
    base: list[Any], entry: dict[str, Any], served: dict[int, str | None], claimed: set[int], key: str
) -> int | None:
    """The position of the base entry ``entry`` updates, or None (it is added)."""
    candidates = [(i, e) for i, e in enumerate(base) if isinstance(e, dict) and i not in claimed]
    name = entry.get("name")
    if isinstance(name, str) and name:
        for i, base_entry in candidates:
            if i not in served:
                served[i] = _served_name(base_entry)
            if served[i] == name:
                return i
    target = _target_key(entry.get("target"))
    same = [i for i, base_entry in candidates if target and _target_key(base_entry.get("target")) == target]
    if len(same) > 1:
        names = ", ".join(repr(served.get(i) or _served_name(base[i])) for i in same)
        raise ConfigError(
            f"{_where_of(entry) or key}: the base file serves {target} {len(same)} times ({names}); "
            "add name: to say which one this entry changes"
        )
    return same[0] if same else None


def _read_yaml(source: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if source.resolve() in seen:
        raise ConfigError(f"config file {source} extends itself (cycle: {' -> '.join(map(str, seen))})")
    try:
        data = yaml.load(source.read_text(), Loader=_yaml_loader(source)) or {}  # a SafeLoader subclass
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {source}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {source} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {source} must contain a mapping at the top level")
    parent = data.pop("extends", None)
    replace = data.pop("replace", None) or []
    if not isinstance(replace, list) or not set(replace) <= set(MERGED_LISTS):
        raise ConfigError(f"{source}: replace must be a list of {list(MERGED_LISTS)}, got {replace!r}")
    if parent is None:
        return data
    parent_path = DEFAULT_CONFIG_PATH if parent == "builtin" else (source.parent / parent)
    return _merge(_read_yaml(parent_path, (*seen, source.resolve())), data, frozenset(replace))


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Config:
    """Read the YAML file (the built-in default when ``path`` is None) and apply env overrides.

    A file may start from another with ``extends: builtin`` (or a relative path) and
    override only what it changes.
    """
    source = Path(path) if path else DEFAULT_CONFIG_PATH
    return config_from_dict(_read_yaml(source), environ)


def config_from_dict(data: dict[str, Any], environ: dict[str, str] | None = None) -> Config:
    data = dict(data)
    _apply_env(data, dict(os.environ) if environ is None else environ)
    config = _build(Config, data, "")
    for spec in config.tools:  # toolsets not given: the default one (None there: every tool is listed)
        if spec.toolsets is None:
            spec.toolsets = [config.default_toolset] if config.default_toolset else []
    for spec in config.verifiers:  # verifiers are in the verifiers toolset anyway
        if spec.toolsets is None:
            spec.toolsets = []
    config.sandbox.uids()  # a bad uid range fails here, not at the first python session
    return config
