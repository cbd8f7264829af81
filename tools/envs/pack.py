"""Environment packs: the records every environment is made of, and the directory format.

A pack is one world: ``PackInfo`` (id, version, origin, domain), optional policy text
(the system prompt of the world), ``EnvTool``s that act on a session's ``World``, the
initial state (tables of records), and ``EnvTask``s. A task carries its prompt (or a
user scenario for a simulated user), the tools it exposes and its distractors, patches
to the initial state, its ``Complexity`` and its ``Gold``: the gold calls (with
``depends_on`` and the arguments to compare), the final answer and the facts the agent
must communicate. The expected final state is never stored: it is what replaying the
gold calls in a fresh world produces (``Pack.replay``), so it cannot drift from the tools.

Directory format (``load_pack``; ``dump_pack`` writes it back)::

    <pack>/pack.yaml     id, version, origin, domain, description, tools (a module), policy (a file)
    <pack>/state.json    {"table": {"key": record, ...}, ...}
    <pack>/tasks.jsonl   one EnvTask per line (``EnvTask.to_dict``)

The tools module exports ``TOOLS`` (a list of ``EnvTool``); it is imported, so a
directory pack is trusted code. Tool code a model or a pipeline wrote is not loaded this
way: it runs in the sandbox.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from protocol import ErrorKind, ToolError, ToolOutput
from tools.envs.world import CallRecord, World, jsonable

__all__ = [
    "SCENARIOS",
    "Complexity",
    "EnvTask",
    "EnvTool",
    "Gold",
    "GoldCall",
    "Judge",
    "Pack",
    "PackInfo",
    "Verdict",
    "dump_pack",
    "load_pack",
]

SCENARIOS = ("single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop")
SCALING_OPERATIONS = (
    "functional_generalisation",
    "parameter_expansion",
    "parameter_type_generalisation",
    "toolset_extension",
)


@dataclass
class PackInfo:
    id: str
    version: str = "1"
    origin: str = "hand"  # hand | procedural | tau2 | bfcl | built
    domain: str = ""
    description: str = ""


@dataclass
class EnvTool:
    """A tool of a world: ``func(world, **arguments)`` returns a JSON-able output.

    ``func`` raises ``protocol.ToolError`` for a request the world refuses (unknown id,
    insufficient stock): the model sees the message, and the call counts as failed.
    ``writes`` marks tools that change the world (their gold calls are the ones a state
    check depends on). A ``protocol.ToolOutput`` return carries content blocks (an image)
    to the model; the session's call log keeps only its structured part. ``blocking``
    marks a tool that does milliseconds of work (drawing, encoding an image): the server
    runs it in a worker thread instead of on its event loop.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    func: Callable[..., Any]
    writes: bool = False
    output_schema: dict[str, Any] | None = None
    blocking: bool = False

    def descriptor(self) -> dict[str, Any]:
        """The MCP tool descriptor (name, description, inputSchema[, outputSchema])."""
        out = {"name": self.name, "description": self.description, "inputSchema": self.input_schema}
        if self.output_schema is not None:
            out["outputSchema"] = self.output_schema
        return out


@dataclass
class GoldCall:
    """One call of a task's solution.

    ``compare`` names the arguments a matching call must agree on (None: all of them);
    ``depends_on`` the ids of gold calls whose outputs this one needs (so it cannot run
    before them); ``output`` the expected output (None: whatever replay produces);
    ``finds`` the values (record ids, labels) its result must hold for the call to count —
    None: for a call whose ``compare`` leaves arguments out, the ``tool_use`` reward derives
    them from the gold replay (``tools.verifiers.tool_use.targets``).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    depends_on: list[str] = field(default_factory=list)
    compare: list[str] | None = None
    output: Any = None
    finds: list[Any] | None = None


@dataclass
class Complexity:
    """How hard a task is, derived from its gold calls' ``depends_on`` graph.

    ``depth`` is the longest dependency chain, ``width`` the most calls at one depth.
    Scenario and level: single-hop (1), parallel single-hop (2), multi-hop (3), parallel
    multi-hop (4). ``scaling`` lists the scaling operations applied to the task.
    """

    scenario: str = "single_hop"
    gold_calls: int = 0
    depth: int = 0
    width: int = 0
    distractors: int = 0
    scaling: list[str] = field(default_factory=list)
    level: int = 1

    @classmethod
    def from_calls(
        cls, calls: Sequence[GoldCall], *, distractors: int = 0, scaling: Sequence[str] = ()
    ) -> Complexity:
        depth_of = call_depths(calls)
        depth = max(depth_of.values(), default=0)
        per_depth: dict[int, int] = {}
        for d in depth_of.values():
            per_depth[d] = per_depth.get(d, 0) + 1
        width = max(per_depth.values(), default=0)
        parallel, multi = width > 1, depth > 1
        scenario = SCENARIOS[int(parallel) + 2 * int(multi)]
        unknown = sorted(set(scaling) - set(SCALING_OPERATIONS))
        if unknown:
            raise ValueError(f"unknown scaling operations {unknown}; known: {', '.join(SCALING_OPERATIONS)}")
        return cls(
            scenario=scenario,
            gold_calls=len(calls),
            depth=depth,
            width=width,
            distractors=distractors,
            scaling=list(scaling),
            level=1 + int(parallel) + 2 * int(multi),
        )


def call_depths(calls: Sequence[GoldCall]) -> dict[str, int]:
    """Depth of each gold call (1 = needs no other call). Raises on unknown ids and cycles."""
    by_id = {c.id: c for c in calls}
    if len(by_id) != len(calls):
        raise ValueError("gold call ids must be unique within a task")
    depths: dict[str, int] = {}

    def depth(call_id: str, seen: tuple[str, ...]) -> int:
        if call_id in depths:
            return depths[call_id]
        if call_id in seen:
            raise ValueError(f"gold calls depend on each other in a cycle: {' -> '.join((*seen, call_id))}")
        call = by_id.get(call_id)
        if call is None:
            raise ValueError(f"gold call {seen[-1]!r} depends on unknown call {call_id!r}")
        depths[call_id] = 1 + max((depth(d, (*seen, call_id)) for d in call.depends_on), default=0)
        return depths[call_id]

    for call in calls:
        depth(call.id, ())
    return depths


@dataclass
class Gold:
    """What solving a task means: the calls, the answer, what the agent must tell the user."""

    calls: list[GoldCall] = field(default_factory=list)
    answer: str | None = None
    communicate: list[str] = field(default_factory=list)


@dataclass
class EnvTask:
    """One task of a pack.

    ``prompt`` is the chat the agent starts from (without the pack's policy, which goes
    in front as system text); ``user_scenario`` is the hidden instruction of a simulated
    user, for worlds that have one. ``tools`` lists the tools the task exposes (None: all
    of the pack's) and ``distractors`` those among them it does not need. ``state_patch``
    is applied to the initial state for this task: ``{table: {key: record | None}}``
    (None deletes). ``reward_basis`` names the reward components the task is judged on.
    """

    id: str
    prompt: list[dict[str, Any]]
    gold: Gold
    complexity: Complexity = field(default_factory=Complexity)
    tools: list[str] | None = None
    distractors: list[str] = field(default_factory=list)
    user_scenario: str | None = None
    state_patch: dict[str, dict[str, Any]] = field(default_factory=dict)
    reward_basis: list[str] = field(default_factory=lambda: ["calls", "state", "answer"])
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for index, call in enumerate(self.gold.calls):
            call.id = call.id or f"c{index}"
        call_depths(self.gold.calls)  # unique ids, known dependencies, no cycle

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvTask:
        values = dict(data)
        gold = dict(values.pop("gold", {}) or {})
        gold["calls"] = [GoldCall(**c) for c in gold.get("calls", [])]
        values["gold"] = Gold(**gold)
        complexity = values.get("complexity")
        # Absent: what the gold calls give (a hand-written task line need not spell it out).
        values["complexity"] = (
            Complexity(**complexity)
            if complexity
            else Complexity.from_calls(gold["calls"], distractors=len(values.get("distractors") or ()))
        )
        return cls(**values)


@dataclass(frozen=True)
class Verdict:
    """A benchmark's own verdict on one trajectory: what its evaluator says, exactly.

    ``reward`` is the number the benchmark reports (τ²: its reward; BFCL: 1.0 when the entry
    is valid, else 0.0); ``checks`` are its own named checks (e.g. τ²'s ``db``, ``action``,
    ``communicate``; BFCL's per-turn ``state``/``response``), each in [0, 1]; ``reason`` says
    why it failed, in the benchmark's words (it may name gold values).
    """

    reward: float
    passed: bool
    checks: dict[str, float] = field(default_factory=dict)
    reason: str = ""


# A pack's benchmark evaluator: (task, the trajectory's messages, the calls that ran, the
# session's final world) -> Verdict. The ``tool_use`` reward in eval mode reports it.
Judge = Callable[[EnvTask, Sequence[Mapping[str, Any]], Sequence[CallRecord], World | None], Verdict]


@dataclass
class Pack:
    """One environment: tools over a world, its initial state, its tasks.

    ``trusted`` is False for tool code that a model or a pipeline wrote: the server then
    runs it only in the sandbox. ``copier`` and ``record_state`` are the ``World``'s
    (how to copy one record, how to compare two).
    """

    info: PackInfo
    tools: list[EnvTool]
    initial_state: dict[str, dict[str, Any]]
    tasks: list[EnvTask] = field(default_factory=list)
    policy: str = ""
    state_schema: dict[str, Any] | None = None
    trusted: bool = True
    copier: Callable[[Any], Any] | None = None
    record_state: Callable[[Any], Any] | None = None
    judge: Judge | None = None  # imported benchmarks: their own evaluator (eval mode's reward)
    _bases: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"pack {self.info.id!r}: tool names must be unique, got {names}")
        ids = [t.id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise ValueError(f"pack {self.info.id!r}: task ids must be unique")

    @property
    def id(self) -> str:
        return self.info.id

    def tool(self, name: str) -> EnvTool:
        for t in self.tools:
            if t.name == name:
                return t
        raise ToolError(f"no tool {name!r} in environment {self.id!r}", ErrorKind.UNKNOWN_TOOL)

    def task(self, task_id: str) -> EnvTask:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"no task {task_id!r} in environment {self.id!r}")

    def base_state(self, task: EnvTask | None = None) -> dict[str, dict[str, Any]]:
        """The state a task starts from (the initial state, patched), built once per task and shared."""
        if task is None or not task.state_patch:
            return self.initial_state
        base = self._bases.get(task.id)
        if base is None:
            base = {
                name: dict(records) for name, records in self.initial_state.items()
            }  # shallow: records shared
            for name, patch in task.state_patch.items():
                table = base.setdefault(name, {})
                for key, record in patch.items():
                    if record is None:
                        table.pop(key, None)
                    else:
                        table[key] = record
            # setdefault: two threads building the same task's base keep one of them, so every
            # world of a task shares one base (World.differences compares worlds over one base).
            base = self._bases.setdefault(task.id, base)
        return base

    def new_world(self, task: EnvTask | None = None) -> World:
        """A fresh copy-on-write world for one session (of ``task``, or of the initial state)."""
        world = World(self.base_state(task), record_state=self.record_state)
        if self.copier is not None:
            world.copier = self.copier
        return world

    def call(self, world: World, name: str, arguments: Mapping[str, Any]) -> Any:
        """Run one tool on ``world`` and log it in ``world.calls``; a ToolError propagates after logging."""
        record = CallRecord(name, dict(arguments))
        world.calls.append(record)
        try:
            output = self.tool(name).func(world, **arguments)
        except ToolError as exc:
            record.error = str(exc)
            raise
        except TypeError as exc:  # wrong argument names: the schema check upstream normally catches them
            record.error = str(exc)
            raise ToolError(f"{name}: {exc}", ErrorKind.INVALID_ARGUMENTS) from None
        except Exception as exc:  # a bug in the tool: logged as a failed call, so no reward counts it solved
            record.error = f"{type(exc).__name__}: {exc}"
            raise ToolError(f"{name} failed: {record.error}", ErrorKind.TOOL_ERROR) from None
        # The log keeps what the tool found, not the images it showed (a session holds its log).
        record.output = output.structured if isinstance(output, ToolOutput) else output
        return output

    def replay(self, task: EnvTask) -> World:
        """A fresh world of ``task`` after its gold calls, in dependency order (the expected final state)."""
        world = self.new_world(task)
        depths = call_depths(task.gold.calls)
        for call in sorted(task.gold.calls, key=lambda c: depths[c.id]):
            # a failing gold call is logged in world.calls; validation reports it
            with contextlib.suppress(ToolError):
                self.call(world, call.name, call.arguments)
        return world


# --------------------------------------------------------------------------- the directory format


def load_pack(path: str | Path) -> Pack:
    """Read a pack directory (``pack.yaml``, ``state.json``, ``tasks.jsonl``)."""
    root = Path(path).expanduser()
    meta_path = root / "pack.yaml"
    if not meta_path.is_file():
        raise ValueError(f"{root} is not an environment pack: no pack.yaml")
    meta = yaml.safe_load(meta_path.read_text()) or {}
    if not isinstance(meta, dict) or "id" not in meta or "tools" not in meta:
        raise ValueError(f"{meta_path} must be a mapping with at least 'id' and 'tools' (a module)")
    module = importlib.import_module(str(meta["tools"]))
    tools = list(getattr(module, "TOOLS", []))
    if not tools or not all(isinstance(t, EnvTool) for t in tools):
        raise ValueError(f"module {meta['tools']} must export TOOLS, a list of EnvTool")
    policy = ""
    if meta.get("policy"):
        policy = (root / str(meta["policy"])).read_text()
    state_path = root / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    tasks = read_tasks(root / "tasks.jsonl")
    info = PackInfo(
        **{k: str(meta[k]) for k in ("id", "version", "origin", "domain", "description") if k in meta}
    )
    schema = (
        json.loads((root / "state.schema.json").read_text())
        if (root / "state.schema.json").is_file()
        else None
    )
    return Pack(info, tools, state, tasks, policy=policy, state_schema=schema)


def read_tasks(path: Path) -> list[EnvTask]:
    """The tasks of a ``tasks.jsonl`` (none when the file is absent); a bad line is an error naming it."""
    tasks = []
    if path.is_file():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    tasks.append(EnvTask.from_dict(json.loads(line)))
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{path}:{number}: {exc}") from None
    return tasks


def dump_pack(pack: Pack, path: str | Path, *, tools_module: str) -> Path:
    """Write ``pack`` as a directory (its tools are referenced by module, not copied)."""
    root = Path(path).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {**asdict(pack.info), "tools": tools_module}
    if pack.policy:
        (root / "policy.md").write_text(pack.policy)
        meta["policy"] = "policy.md"
    (root / "pack.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    (root / "state.json").write_text(json.dumps(pack.initial_state, indent=1, default=jsonable))
    if pack.state_schema is not None:
        (root / "state.schema.json").write_text(json.dumps(pack.state_schema, indent=1))
    with open(root / "tasks.jsonl", "w") as handle:
        for task in pack.tasks:
            handle.write(json.dumps(task.to_dict(), default=jsonable) + "\n")
    return root
