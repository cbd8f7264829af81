"""Task composition shared by every procedural world.

A world supplies *steps*: small solved pieces of work (a sentence of the user's prompt,
the gold calls that do it, the answer if it asks a question), each built from the
task's state by a function ``step(ctx) -> Step | None``. Steps come in five kinds:

- ``read`` / ``write``: one call (a question, or a change) on one entity;
- ``pair``: two independent calls whose outputs answer one question (parallel reads);
- ``chain``: a lookup, then an action on what it found (each call needs the one before);
- ``fork``: two independent lookups that one action needs (parallel multi-hop).

A level is a plan over those kinds: 1 = one read or write; 2 = a pair, or two singles
on different entities; 3 = a chain; 4 = a fork or two chains, with distractor tools
exposed. A world may also offer *variant* steps of a kind (``FUNCTIONAL_STEPS``,
``TYPED_STEPS``: functional and parameter-type generalisation, see ``Options``); a step
slot draws from them with the option's probability, keeping the kind's call shape.
``Complexity.from_calls`` recomputes the level from ``depends_on`` and the composer
checks that it agrees. Steps of one task claim the records they read or write
(``Context.claim``), so their calls commute and parallel calls may run in any order.

An answer carries ``derive``, a small spec of how it follows from the gold calls'
outputs (``derive_answer``), so checks and rewards can recompute it from a replay.

A gold call's ``compare`` names the arguments that decide the outcome: ids, amounts,
titles, and filters whose result is counted. Free-text search words, and filters that
only narrow a lookup, are not compared: another correct path must not lose reward.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tools.envs.pack import SCALING_OPERATIONS, Complexity, EnvTask, Gold, GoldCall

__all__ = [
    "Context",
    "Options",
    "Step",
    "StepFn",
    "compose_task",
    "derive_answer",
    "field",
    "gold",
    "lookups",
    "output_records",
    "over_pair",
]


@dataclass(frozen=True)
class Options:
    """The generator's knobs (the paper's scaling operations among them).

    ``distractors``: how many unneeded tools a task with toolset extension exposes
    (always at level 4; at levels 1-3 with probability ``toolset_extension``).
    ``parameter_expansion``: probability that a step which can uses optional parameters
    (a status filter, a type, a date) and says so in its prompt. ``patched``: share of
    tasks that start from a patched state (records re-rolled before the task).
    ``functional_generalisation``: probability that a step slot whose kind has goal
    variants asks for the same lookups on behalf of a goal ("I want to pay 850 from
    A-7003: is there enough?", a yes/no answer) or uses a tool for another purpose.
    ``parameter_type_generalisation``: probability that a step slot whose kind has typed
    variants uses a tool with a richer-typed argument (a list of ids, a range object,
    an enum); such packs carry those tools (``tools.envs.procedural.typed``). Both are
    0 by default, and at 0 they draw nothing: packs are what they were without them.
    """

    distractors: int = 2
    toolset_extension: float = 0.0
    parameter_expansion: float = 0.3
    patched: float = 0.3
    functional_generalisation: float = 0.0
    parameter_type_generalisation: float = 0.0

    def __post_init__(self) -> None:
        if self.distractors < 0:
            raise ValueError(f"distractors must be >= 0, got {self.distractors}")
        for name in (
            "toolset_extension",
            "parameter_expansion",
            "patched",
            "functional_generalisation",
            "parameter_type_generalisation",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


@dataclass
class Step:
    """One solved piece of a task; call ids are local to the step."""

    name: str
    calls: list[GoldCall]
    ask: str
    writes: bool = False
    answer: str | None = None
    derive: dict[str, Any] | None = None
    communicate: list[str] = field(default_factory=list)
    scaling: list[str] = field(default_factory=list)


Picked = tuple[str, dict[str, Any]]  # a record's key and the record


@dataclass
class Context:
    """What a step function builds from: the task's state, a seeded rng, the options."""

    rng: random.Random
    state: Mapping[str, Mapping[str, dict[str, Any]]]
    options: Options
    focus: set[str] = field(default_factory=set)  # "table:key" of patched records: steps prefer them
    taken: set[str] = field(default_factory=set)

    def claim(self, table: str, *keys: str) -> bool:
        """Reserve records for this step; False when another step of the task holds one."""
        wanted = {f"{table}:{key}" for key in keys}
        if wanted & self.taken:
            return False
        self.taken |= wanted
        return True

    def pick(self, table: str, where: Callable[[dict[str, Any]], bool] | None = None) -> Picked | None:
        """A record of ``table`` not yet claimed (patched ones first, half of the time), claimed."""
        rows = self.state[table]
        keys = [k for k in rows if f"{table}:{k}" not in self.taken and (where is None or where(rows[k]))]
        if not keys:
            return None
        focused = [k for k in keys if f"{table}:{k}" in self.focus]
        key = self.rng.choice(focused if focused and self.rng.random() < 0.5 else keys)
        self.claim(table, key)
        return key, rows[key]

    def pick_two(self, table: str, differ: str) -> tuple[Picked, Picked] | None:
        """Two records of ``table`` whose ``differ`` field differs (a pair question has one answer)."""
        first = self.pick(table)
        if first is None:
            return None
        second = self.pick(table, lambda r: r[differ] != first[1][differ])
        return None if second is None else (first, second)

    def expand(self) -> bool:
        """Whether this step uses its optional parameters (parameter expansion)."""
        return self.rng.random() < self.options.parameter_expansion


StepFn = Callable[[Context], Step | None]


# --------------------------------------------------------------------------- composing a task


def _plan(level: int, rng: random.Random) -> list[str]:
    if level == 1:
        return [rng.choice(("read", "write"))]
    if level == 2:
        return rng.choice((["pair"], ["pair"], ["read", "write"], ["write", "read"], ["write", "write"]))
    if level == 3:
        return ["chain"]
    if level == 4:
        return rng.choice((["fork"], ["fork"], ["chain", "chain"]))
    raise ValueError(f"levels are 1 to 4, got {level}")


# (option, the world's table of variant steps for it)
VARIANTS = (
    ("functional_generalisation", "FUNCTIONAL_STEPS"),
    ("parameter_type_generalisation", "TYPED_STEPS"),
)


def _functions(worlds: Sequence[ModuleType], kind: str, ctx: Context) -> list[StepFn]:
    """The step functions a slot of ``kind`` draws from: variants when an option fires.

    ``worlds``: the world's module, then its typed module if the pack has one.
    """
    pool: list[StepFn] = []
    for option, table in VARIANTS:
        chance = getattr(ctx.options, option)
        variants = [f for world in worlds for f in getattr(world, table, {}).get(kind, ())]
        # no draw at 0: the rng stream, so every default pack, stays what it was
        if chance > 0 and variants and ctx.rng.random() < chance:
            pool += variants
    return pool or list(worlds[0].STEPS.get(kind) or ())


def _build(worlds: Sequence[ModuleType], plan: list[str], ctx: Context) -> list[Step] | None:
    steps = []
    for kind in plan:
        functions = _functions(worlds, kind, ctx)
        if not functions:
            return None
        step = ctx.rng.choice(functions)(ctx)
        if step is None:
            return None
        steps.append(step)
    if sum(s.answer is not None for s in steps) > 1:
        return None  # one question per task: the answer is one short string
    return steps


def _renamed(spec: Any, ids: Mapping[str, str]) -> Any:
    if isinstance(spec, dict):
        return {k: (ids[v] if k == "call" else _renamed(v, ids)) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_renamed(v, ids) for v in spec]
    return spec


def _ordered(names: Iterable[str], order: Sequence[str]) -> list[str]:
    wanted = set(names)
    return [n for n in order if n in wanted]


def compose_task(
    world: ModuleType,
    task_id: str,
    level: int,
    rng: random.Random,
    initial_state: Mapping[str, Mapping[str, dict[str, Any]]],
    options: Options,
    typed: ModuleType | None = None,
) -> EnvTask:
    """One task of ``level`` in ``world`` (a module with TOOLS, STEPS and patch); ``typed``:
    the world's typed module (its TOOLS, a superset, and TYPED_STEPS), for packs that have it."""
    tool_names = [t.name for t in (typed or world).TOOLS]
    worlds = (world,) if typed is None else (world, typed)
    for _attempt in range(200):
        patch: dict[str, dict[str, Any]] = {}
        state: Mapping[str, Mapping[str, dict[str, Any]]] = initial_state
        if rng.random() < options.patched:
            patch = world.patch(rng, initial_state)
            state = {t: {**rows, **patch.get(t, {})} for t, rows in initial_state.items()}
        focus = {f"{t}:{k}" for t, rows in patch.items() for k in rows}
        ctx = Context(rng, state, options, focus=focus)
        steps = _build(worlds, _plan(level, rng), ctx)
        if steps is not None:
            break
    else:
        raise RuntimeError(f"{world.NAME}: could not compose a level {level} task for {task_id}")

    calls: list[GoldCall] = []
    answer, derive, communicate, scaling = None, None, [], set()
    for step in steps:
        ids = {c.id: f"c{len(calls) + n}" for n, c in enumerate(step.calls)}
        for c in step.calls:
            calls.append(GoldCall(c.name, c.arguments, ids[c.id], [ids[d] for d in c.depends_on], c.compare))
        if step.answer is not None:
            answer, derive = step.answer, _renamed(step.derive, ids)
        communicate += step.communicate
        scaling |= set(step.scaling)

    used = {c.name for c in calls}
    distractors: list[str] = []
    if options.distractors and (level == 4 or rng.random() < options.toolset_extension):
        spare = [n for n in tool_names if n not in used]
        distractors = sorted(rng.sample(spare, min(options.distractors, len(spare))))
        if distractors:
            scaling.add("toolset_extension")
    writes = any(s.writes for s in steps)
    complexity = Complexity.from_calls(
        calls, distractors=len(distractors), scaling=sorted(scaling, key=SCALING_OPERATIONS.index)
    )
    if complexity.level != level:  # a step function broke its kind's shape
        raise RuntimeError(
            f"{task_id}: steps {[s.name for s in steps]} make level {complexity.level}, not {level}"
        )
    ask = " ".join(s.ask for s in steps)
    return EnvTask(
        id=task_id,
        prompt=[{"role": "user", "content": ask}],
        gold=Gold(calls=calls, answer=answer, communicate=communicate),
        complexity=complexity,
        tools=_ordered(used | set(distractors), tool_names),
        distractors=distractors,
        state_patch=patch,
        # state even on a question: a write it did not ask for fails it
        reward_basis=["calls", "state"] + (["answer"] if answer is not None else []),
        metadata={"world": world.NAME, "steps": [s.name for s in steps], "writes": writes, "derive": derive},
    )


# --------------------------------------------------------------------------- answers from outputs


def output_records(output: Any) -> list[dict[str, Any]]:
    """The records in a tool output: the output itself when it is one, else its lists of records."""
    if isinstance(output, list):
        return [r for r in output if isinstance(r, dict)]
    if not isinstance(output, dict):
        return []
    if "id" in output:
        return [output]
    return [r for v in output.values() if isinstance(v, list) for r in v if isinstance(r, dict)]


def derive_answer(spec: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    """Evaluate an answer spec over gold call outputs (``{call id: output}``).

    ``field``: ``record[field]`` of the record ``id`` in a call's output; ``count``: how
    many records a call returned; ``sum``: the sum of sub-specs; ``argmin``/``argmax``:
    the label of the smallest/largest sub-spec; ``within``: ``labels[0]`` when the one
    sub-spec lies in [``min``, ``max``] (either may be absent), else ``labels[1]``.
    """
    op = spec["op"]
    if op == "field":
        for record in output_records(outputs[spec["call"]]):
            if record.get("id") == spec["id"]:
                return record[spec["field"]]
        raise KeyError(f"no record {spec['id']!r} in the output of {spec['call']}")
    if op == "count":
        return len(output_records(outputs[spec["call"]]))
    values = [derive_answer(s, outputs) for s in spec["of"]]
    if op == "sum":
        return round(sum(values), 2)
    if op in ("argmin", "argmax"):
        pick = min if op == "argmin" else max
        return spec["labels"][values.index(pick(values))]
    if op == "within":
        low, high = spec.get("min"), spec.get("max")
        inside = (low is None or values[0] >= low) and (high is None or values[0] <= high)
        return spec["labels"][0 if inside else 1]
    raise ValueError(f"unknown answer op {op!r}")


def gold(
    name: str, arguments: dict[str, Any], id: str, after: Sequence[str] = (), compare: list[str] | None = None
) -> GoldCall:
    """A gold call of a step (``after``: the step's calls whose outputs it needs)."""
    return GoldCall(name, arguments, id, list(after), compare)


def lookups(
    tool: str, argument: str, first: str, second: str, compare: list[str] | None = None
) -> list[GoldCall]:
    """Two independent calls of ``tool`` (ids ``a`` and ``b``): the calls of a pair step."""
    return [
        gold(tool, {argument: first}, "a", compare=compare),
        gold(tool, {argument: second}, "b", compare=compare),
    ]


def field(call: str, record_id: str, name: str) -> dict[str, Any]:
    """Answer spec: ``name`` of the record ``record_id`` in the output of ``call``."""
    return {"op": "field", "call": call, "id": record_id, "field": name}


def over_pair(op: str, name: str, ids: tuple[str, str], labels: list[str] | None = None) -> dict[str, Any]:
    """Answer spec over a pair step: ``op`` (sum, argmin, argmax) of field ``name`` of records
    ``ids`` in the outputs of calls ``a`` and ``b``; argmin/argmax answer with ``labels``."""
    spec: dict[str, Any] = {"op": op, "of": [field("a", ids[0], name), field("b", ids[1], name)]}
    if labels is not None:
        spec["labels"] = labels
    return spec
