"""The deterministic gate: what a generated world must pass before it becomes a pack.

Tools: every input schema is a valid JSON schema whose patterns RE2 can run (the server
checks arguments with a linear-time engine, ``tools.patterns``, and would not serve it);
the assembled source parses (``ast``, in process) and loads with every tool defined (in
the sandbox).

Tasks, each replayed in a fresh world, in the sandbox:

* solvable: every gold call runs without error (a refusal or crash rejects the task);
* reproducible: a second replay gives the same outputs and the same final state; those
  outputs become the gold calls' expected ``output``;
* a task that calls a writing tool changes the state;
* its answer (when it has one) appears in a gold call's output, and a call that
  ``depends_on`` others gets one of its argument values from their outputs.

No tool leaks an answer. The probe, per task with an answer and per tool its gold calls
use: run the tool on a fresh world of the task with the task's own arguments, and with
other valid arguments made by replacing one argument at a time with another value of
the same JSON type found in the world's data (values of a field named like the argument
first, then record keys, then any field value; only inputs the tool's schema accepts; up
to ``PROBES`` of them, the arguments varied in turn). If the tool answers at least one
of those other inputs and *every* answer it gives contains the task's answer (as a whole
value or a whole word, case-folded), the answer does not depend on the input: the tool
leaks it, and the tool is rejected with every task that uses it. A tool without
parameters, or whose other inputs all fail, is not judged (there is nothing to vary).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from tqdm import tqdm

from protocol import ToolError
from tools.envs.builder.llm import StageLog
from tools.envs.builder.sandboxed import SandboxExecutor
from tools.envs.pack import Complexity, EnvTask, Pack, call_depths
from tools.patterns import UnsafePattern, check_schema, linear_validator

__all__ = ["PROBES", "GateResult", "ProbePool", "leak_probes", "mentions", "run_gate"]

PROBES = 4


@dataclass
class GateResult:
    tools: StageLog = field(default_factory=StageLog)
    tasks: StageLog = field(default_factory=StageLog)
    rejected_tools: set[str] = field(default_factory=set)
    accepted: list[EnvTask] = field(default_factory=list)


def mentions(value: Any, answer: str) -> bool:
    """Whether ``answer`` is one of ``value``'s leaves, or a whole word of a string leaf (case-folded)."""
    target = answer.strip().casefold()
    if not target:
        return False
    pattern = re.compile(r"(?<!\w)" + re.escape(target) + r"(?!\w)")
    for leaf in _leaves(value):
        if isinstance(leaf, str):
            if pattern.search(leaf.casefold()):
                return True
        elif leaf is not None and (str(leaf).casefold() == target or _same_number(leaf, target)):
            return True
    return False


def _same_number(leaf: Any, text: str) -> bool:
    if isinstance(leaf, bool) or not isinstance(leaf, int | float):
        return False
    try:
        return float(text) == float(leaf)
    except ValueError:
        return False


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


# ------------------------------------------------------------------ tools


def check_tools(pack: Pack, source: str, executor: SandboxExecutor, result: GateResult) -> None:
    try:
        ast.parse(source)
        loaded = executor.parameters(source, [t.name for t in pack.tools])
    except (SyntaxError, ValueError) as exc:
        loaded, problem = {}, f"the assembled tool module does not load: {exc}"
    else:
        problem = ""
    for tool in pack.tools:
        try:
            check_schema(tool.input_schema)  # its patterns on RE2, never compiled with ``re``
        except jsonschema.SchemaError as exc:
            _reject_tool(result, tool.name, f"input schema invalid: {exc.message}")
            continue
        except UnsafePattern as exc:
            _reject_tool(result, tool.name, f"input schema: {exc}")
            continue
        if tool.name not in loaded:
            _reject_tool(result, tool.name, problem or "its function is not defined")


def _reject_tool(result: GateResult, name: str, reason: str) -> None:
    if name not in result.rejected_tools:
        result.rejected_tools.add(name)
        result.tools.reject(name, reason)


# ------------------------------------------------------------------ tasks


def _replay(pack: Pack, task: EnvTask) -> tuple[dict[str, Any], str, bool]:
    """Outputs by call id, the final state's digest, whether it changed. ToolError names the failing call."""
    world = pack.new_world(task)
    depths = call_depths(task.gold.calls)
    outputs: dict[str, Any] = {}
    for call in sorted(task.gold.calls, key=lambda c: depths[c.id]):
        try:
            outputs[call.id] = pack.call(world, call.name, call.arguments)
        except ToolError as exc:
            raise ToolError(f"gold call {call.id} ({call.name}) fails: {exc}", exc.kind) from None
    return outputs, world.digest(), bool(world.changed())


def check_task(pack: Pack, task: EnvTask) -> str | None:
    """Why the task fails the gate (None: it passes); fills in the gold calls' outputs."""
    try:
        outputs, digest, changed = _replay(pack, task)
        again, digest_again, _ = _replay(pack, task)
    except ToolError as exc:
        return f"not solvable: {exc}"
    if again != outputs or digest_again != digest:
        return "not reproducible: a second replay gave other outputs or another final state"
    writes = {t.name for t in pack.tools if t.writes}
    if any(c.name in writes for c in task.gold.calls) and not changed:
        return "calls a writing tool but leaves the state unchanged"
    answer = task.gold.answer
    if answer and not any(mentions(out, answer) for out in outputs.values()):
        return f"its answer {answer!r} appears in no gold call's output"
    by_id = {c.id: c for c in task.gold.calls}
    for call in task.gold.calls:
        if call.depends_on:
            sources = [outputs[d] for d in call.depends_on]
            values = [v for v in _leaves(call.arguments) if not isinstance(v, dict | list)]
            if not any(mentions(out, str(v)) for out in sources for v in values):
                return (
                    f"call {call.id} depends on {', '.join(call.depends_on)} but takes none of its "
                    "argument values from their output"
                )
    for call_id, output in outputs.items():
        by_id[call_id].output = output
    return None


# ------------------------------------------------------------------ the leak probe


class ProbePool:
    """Candidate arguments from the world's data: values of a same-named field first, then record keys, then the rest."""

    def __init__(self, state: dict[str, dict[str, Any]]) -> None:
        self.by_field: dict[str, list[Any]] = {}
        self.keys: list[Any] = []
        self.rest: list[Any] = []
        for table in state.values():
            for key, record in table.items():
                self.keys.append(key)
                if isinstance(record, dict):
                    for name, value in record.items():
                        for leaf in _leaves(value):
                            if leaf is not None and not isinstance(leaf, dict | list):
                                self.by_field.setdefault(name, []).append(leaf)
                                self.rest.append(leaf)

    def values(self, argument: str) -> list[Any]:
        seen: dict[tuple[str, str], Any] = {}
        for value in (*self.by_field.get(argument, []), *self.keys, *sorted(self.rest, key=repr)):
            seen.setdefault((type(value).__name__, repr(value)), value)
        return list(seen.values())


def leak_probes(schema: dict[str, Any], arguments: dict[str, Any], pool: ProbePool) -> list[dict[str, Any]]:
    """Up to PROBES other valid inputs: one argument replaced by a pool value of its type the schema accepts."""
    validator = linear_validator(schema)  # the model wrote the schema: its patterns run in linear time
    per_argument = {
        name: [
            {**arguments, name: other}
            for other in pool.values(name)
            if type(other) is type(value) and other != value
        ]
        for name, value in sorted(arguments.items())
    }
    probes: list[dict[str, Any]] = []
    for rank in range(max((len(v) for v in per_argument.values()), default=0)):
        for candidates in per_argument.values():  # round robin: every argument gets varied
            if rank < len(candidates) and len(probes) < PROBES and validator.is_valid(candidates[rank]):
                probes.append(candidates[rank])
        if len(probes) >= PROBES:
            break
    return probes


def leaks(pack: Pack, task: EnvTask, tool_name: str, pool: ProbePool) -> str | None:
    """Why ``tool_name`` leaks ``task``'s answer (None: it does not, or cannot be judged)."""
    answer = task.gold.answer or ""
    tool = pack.tool(tool_name)
    outputs, probed = [], []
    for call in (c for c in task.gold.calls if c.name == tool_name):
        for arguments in [call.arguments, *leak_probes(tool.input_schema, call.arguments, pool)]:
            try:
                outputs.append(pack.call(pack.new_world(task), tool_name, arguments))
                probed.append(arguments)
            except ToolError:
                continue
    others = [a for a in probed if all(a != c.arguments for c in task.gold.calls)]
    if others and all(mentions(out, answer) for out in outputs):
        return (
            f"leaks the answer of task {task.id}: its output contains {answer!r} for every input "
            f"probed ({len(probed)}, e.g. {others[0]})"
        )
    return None


# ------------------------------------------------------------------ the gate


def _drop_distractors(task: EnvTask, rejected: set[str]) -> None:
    """Rejected tools leave the task's toolset; its complexity follows."""
    if not rejected & set(task.distractors):
        return
    task.distractors = [d for d in task.distractors if d not in rejected]
    if task.tools is not None:
        task.tools = [t for t in task.tools if t not in rejected]
    scaling = [s for s in task.complexity.scaling if task.distractors or s != "toolset_extension"]
    task.complexity = Complexity.from_calls(
        task.gold.calls, distractors=len(task.distractors), scaling=scaling
    )


def run_gate(pack: Pack, source: str, executor: SandboxExecutor, *, progress: bool = False) -> GateResult:
    """Check the draft ``pack`` (tools in the sandbox, tasks unchecked); accepted tasks get their outputs."""
    result = GateResult()
    check_tools(pack, source, executor, result)
    pool = ProbePool(pack.initial_state)
    replayed: list[EnvTask] = []
    reasons: dict[str, str] = {}
    for task in tqdm(pack.tasks, desc="gate", unit="task", disable=not progress, leave=False):
        bad = sorted({c.name for c in task.gold.calls} & result.rejected_tools)
        reason = f"uses rejected tools {bad}" if bad else check_task(pack, task)
        if reason:
            reasons[task.id] = reason
            continue
        replayed.append(task)
        if task.gold.answer:
            for name in sorted({c.name for c in task.gold.calls}):
                leak = leaks(pack, task, name, pool)
                if leak:
                    _reject_tool(result, name, leak)
    for task in pack.tasks:
        bad = sorted({c.name for c in task.gold.calls} & result.rejected_tools)
        if task.id not in reasons and bad:
            reasons[task.id] = f"uses rejected tools {bad}"
        if task.id in reasons:
            result.tasks.reject(task.id, reasons[task.id])
        else:
            _drop_distractors(task, result.rejected_tools)
            result.tasks.accept()
            result.accepted.append(task)
    result.tools.accept(len(pack.tools) - len(result.rejected_tools))
    return result
