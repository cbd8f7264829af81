"""The four generating stages: each asks the model (``llm.ask``) and checks what comes back.

1. decomposition: scenario -> domain, entities (tables with a key and typed fields), capabilities
2. documents: tool documents (JSON input schema, output, tables read and written) and an
   initial state whose records have exactly their entity's fields
3. functions: the source of each tool, ``def name(world, ...)``; parsed here (``ast``, safe),
   loaded only in the sandbox
4. tasks: per level, tasks composed from the tools (gold calls with ``depends_on`` and
   ``compare``, answer, distractors, scaling operations), checked against the tools'
   schemas and the level their dependency graph really has; then ``extend_toolset`` adds,
   by code, a distractor variant of every task the model gave none

A check raises ``Rejected`` with the reason; the model is asked again with it.
"""

from __future__ import annotations

import ast
import hashlib
import random
from collections.abc import Callable
from typing import Any

import jsonschema

from tools.envs.builder import prompts, schemas
from tools.envs.builder.llm import ChatModel, Rejected, StageLog, ask, schema_problem
from tools.envs.builder.sandboxed import SandboxExecutor
from tools.envs.pack import Complexity, EnvTask, GoldCall
from tools.patterns import UnsafePattern, check_schema

__all__ = ["decompose", "document", "extend_toolset", "integrate", "scale"]

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _unique(names: list[str], what: str) -> None:
    seen = {n for n in names if names.count(n) > 1}
    if seen:
        raise Rejected(f"{what} names must be unique, repeated: {', '.join(sorted(seen))}")


# ------------------------------------------------------------------ 1. scenario decomposition


def check_entities(entities: list[dict[str, Any]]) -> None:
    _unique([e["name"] for e in entities], "entity")
    for entity in entities:
        fields = [f["name"] for f in entity["fields"]]
        _unique(fields, f"field (entity {entity['name']})")
        if entity["key"] not in fields:
            raise Rejected(
                f"entity {entity['name']}: key {entity['key']!r} is not one of its fields {fields}"
            )


def check_decomposition(value: dict[str, Any]) -> dict[str, Any]:
    entities = value["entities"]
    check_entities(entities)
    known = {e["name"] for e in entities}
    _unique([c["name"] for c in value["capabilities"]], "capability")
    for capability in value["capabilities"]:
        unknown = sorted(set(capability["entities"]) - known)
        if unknown:
            raise Rejected(f"capability {capability['name']} uses unknown entities {unknown}")
    return value


def decompose(
    model: ChatModel, scenario: str, log: StageLog, attempts: int, *, small: bool = False
) -> dict[str, Any] | None:
    return ask(
        model, prompts.decomposition(scenario), schemas.DECOMPOSITION, check_decomposition, log,
        label="decomposition", attempts=attempts,
        guide=lambda last: schemas.decomposition_guide(_fine_entities(last), small=small),
    )  # fmt: skip


def _fine_entities(last: Any) -> list[dict[str, Any]] | None:
    """The last answer's entities when they pass the rules (then its capabilities did not)."""
    try:
        entities = last["entities"]
        if schema_problem(entities, schemas.DECOMPOSITION["properties"]["entities"]) is None:
            check_entities(entities)
            return entities
    except (TypeError, KeyError, Rejected):
        pass  # nothing usable to keep
    return None


# ------------------------------------------------------------------ 2. document generation


def check_documents(value: dict[str, Any], decomposition: dict[str, Any]) -> dict[str, Any]:
    entities = {e["name"]: e for e in decomposition["entities"]}
    tools = value["tools"]
    _unique([t["name"] for t in tools], "tool")
    for tool in tools:
        parameters = tool["parameters"]
        try:
            check_schema(parameters)  # its patterns on RE2, never compiled with ``re``
        except UnsafePattern:
            pass  # the gate refuses that tool and says why
        except jsonschema.SchemaError as exc:
            raise Rejected(
                f"tool {tool['name']}: parameters is not a valid JSON schema: {exc.message}"
            ) from None
        if parameters.get("type") != "object" or not isinstance(parameters.get("properties", {}), dict):
            raise Rejected(f"tool {tool['name']}: parameters must be an object schema with properties")
        missing = sorted(set(parameters.get("required", [])) - set(parameters.get("properties", {})))
        if missing:
            raise Rejected(f"tool {tool['name']}: required parameters {missing} are not in properties")
        unknown = sorted((set(tool["reads"]) | set(tool["writes"])) - set(entities))
        if unknown:
            raise Rejected(
                f"tool {tool['name']} uses unknown tables {unknown} (entities: {sorted(entities)})"
            )
    state = value["initial_state"]
    if set(state) != set(entities):
        raise Rejected(f"initial_state must have exactly the tables {sorted(entities)}, got {sorted(state)}")
    tables: dict[str, dict[str, Any]] = {}
    for name, records in state.items():
        tables[name] = _records(entities[name], records)
    return {"tools": tools, "initial_state": tables, "policy": str(value.get("policy") or "")}


def _records(entity: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    fields = {f["name"]: f["type"] for f in entity["fields"]}
    table: dict[str, Any] = {}
    for index, record in enumerate(records):
        where = f"initial_state.{entity['name']}[{index}]"
        if set(record) != set(fields):
            raise Rejected(f"{where} has fields {sorted(record)}, the entity has {sorted(fields)}")
        for field, kind in fields.items():
            if not _JSON_TYPES[kind](record[field]):
                raise Rejected(f"{where}.{field} = {record[field]!r} is not of type {kind}")
        key = record[entity["key"]]
        if not isinstance(key, str | int) or isinstance(key, bool) or str(key) in table:
            raise Rejected(f"{where}: key {entity['key']} = {key!r} must be a unique string or integer")
        table[str(key)] = record
    return table


def document(
    model: ChatModel,
    scenario: str,
    decomposition: dict[str, Any],
    log: StageLog,
    attempts: int,
    *,
    small: bool = False,
) -> dict[str, Any] | None:
    return ask(
        model, prompts.documents(scenario, decomposition), schemas.DOCUMENTS,
        lambda value: check_documents(value, decomposition), log, label="documents", attempts=attempts,
        guide=lambda last: schemas.documents_guide(
            decomposition, _kept_arguments(decomposition, last) if small else None, small=small
        ),
    )  # fmt: skip


def _kept_arguments(decomposition: dict[str, Any], last: Any) -> dict[str, dict[str, Any]]:
    """Per tool, the argument properties of the last answer that fit the small-model guide (kept on a retry)."""
    capabilities = {c["name"]: c for c in decomposition["capabilities"]}
    kept = {}
    for tool in last.get("tools", []) if isinstance(last, dict) else []:
        try:
            properties = tool["parameters"]["properties"]
            fields = schemas.tool_fields(decomposition, capabilities[tool["name"]])
            if all(fields.get(name) == spec["type"] for name, spec in properties.items()):
                kept[tool["name"]] = properties
        except (TypeError, KeyError, AttributeError):
            continue  # nothing usable in this tool
    return kept


# ------------------------------------------------------------------ 3. function integration


def check_source(tool: dict[str, Any], value: dict[str, Any], executor: SandboxExecutor) -> str:
    """The tool's source if it parses, defines just this function with fitting parameters, and loads in the sandbox."""
    name, source = tool["name"], value["source"]
    if value["name"] != name:
        raise Rejected(f"the answer implements {value['name']!r}, not {name!r}")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Rejected(f"syntax error line {exc.lineno}: {exc.msg}") from None
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    others = [
        n for n in tree.body
        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Import | ast.ImportFrom)
        and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]  # fmt: skip
    if [f.name for f in functions] != [name] or others:
        raise Rejected(f"the source must define exactly one top-level function {name!r} (plus imports)")
    function = functions[0]
    if isinstance(function, ast.AsyncFunctionDef):
        raise Rejected(f"{name} must be a plain def, not async")
    _check_signature(tool, function.args)
    try:
        executor.parameters(source, [name])  # loads the module, in the sandbox
    except ValueError as exc:
        raise Rejected(f"the module does not load: {exc}") from None
    return source


def _check_signature(tool: dict[str, Any], args: ast.arguments) -> None:
    positional = [*args.posonlyargs, *args.args]
    if not positional or positional[0].arg != "world" or args.posonlyargs[1:]:
        raise Rejected(f"{tool['name']} must take world as its first parameter, then keyword parameters")
    params = positional[1:] + args.kwonlyargs
    with_default = {p.arg for p in positional[len(positional) - len(args.defaults) :]} | {
        p.arg for p, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    }
    properties = tool["parameters"].get("properties", {})
    required = set(tool["parameters"].get("required", []))
    names = {p.arg for p in params}
    if args.kwarg is None:
        missing = sorted(set(properties) - names)
        if missing:
            raise Rejected(f"{tool['name']} lacks parameters {missing} of its schema")
    extra = sorted(names - set(properties) - with_default)
    if extra:
        raise Rejected(
            f"{tool['name']} has parameters {extra} that its schema does not define (and no default)"
        )
    optional_without = sorted((names & set(properties)) - required - with_default)
    if optional_without:
        raise Rejected(f"{tool['name']}: optional parameters {optional_without} need a default")


def integrate(
    model: ChatModel,
    tool: dict[str, Any],
    decomposition: dict[str, Any],
    state: dict[str, Any],
    executor: SandboxExecutor,
    log: StageLog,
    attempts: int,
    *,
    small: bool = False,
) -> str | None:
    tables = set(tool["reads"]) | set(tool["writes"]) or set(state)
    sample = {name: dict(list(state[name].items())[:2]) for name in sorted(tables)}
    entities = [e for e in decomposition["entities"] if e["name"] in tables]
    return ask(
        model, prompts.function(tool, entities, sample), schemas.FUNCTION,
        lambda value: check_source(tool, value, executor), log, label=f"function {tool['name']}",
        attempts=attempts, guide=schemas.function_guide(tool, small=small),
    )  # fmt: skip


# ------------------------------------------------------------------ 4. complexity scaling


def check_task(task: dict[str, Any], level: int, tools: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A task whose calls fit the tools' schemas and whose dependency graph has ``level``."""
    calls = task["calls"]
    for call in calls:
        tool = tools.get(call["name"])
        if tool is None:
            raise Rejected(f"call {call['id']} uses unknown tool {call['name']!r} (tools: {sorted(tools)})")
        problem = schema_problem(call["arguments"], tool["parameters"])
        if problem:
            raise Rejected(f"call {call['id']} ({call['name']}): arguments do not fit the schema: {problem}")
        unknown = sorted(set(call.get("compare") or []) - set(call["arguments"]))
        if unknown:
            raise Rejected(f"call {call['id']}: compare names arguments it does not pass: {unknown}")
    used = {c["name"] for c in calls}
    distractors = list(dict.fromkeys(task.get("distractors", [])))
    bad = sorted(d for d in distractors if d not in tools or d in used)
    if bad:
        raise Rejected(f"distractors {bad} must be tools of the world that the task does not call")
    scaling = list(dict.fromkeys(task.get("scaling", [])))
    if ("toolset_extension" in scaling) != bool(distractors):
        raise Rejected("toolset_extension and distractors go together (one without the other)")
    try:
        gold = [
            GoldCall(c["name"], c["arguments"], c["id"], list(c.get("depends_on", [])), c.get("compare"))
            for c in calls
        ]
        complexity = Complexity.from_calls(gold, distractors=len(distractors), scaling=scaling)
    except ValueError as exc:
        raise Rejected(str(exc)) from None
    if complexity.level != level:
        raise Rejected(
            f"asked for level {level}, but the calls' dependencies make a {complexity.scenario} task "
            f"(level {complexity.level})"
        )
    return {**task, "distractors": distractors, "scaling": scaling, "level": level}


def scale(
    model: ChatModel,
    level: int,
    count: int,
    documents: dict[str, Any],
    tools: list[str],
    log: StageLog,
    attempts: int,
    *,
    small: bool = False,
) -> list[dict[str, Any]]:
    """Valid tasks of ``level`` (each invalid one logged with its reason); [] when no answer had one."""
    docs = {t["name"]: t for t in documents["tools"] if t["name"] in tools}

    def check(value: dict[str, Any]) -> list[dict[str, Any]]:
        good, reasons = [], []
        for index, task in enumerate(value["tasks"]):
            try:
                good.append(check_task(task, level, docs))
            except Rejected as exc:
                reasons.append(str(exc))
                log.reject(f"level {level} task {index}", str(exc))
        if not good:
            raise Rejected("no task was valid: " + "; ".join(reasons[:3]))
        log.accept(len(good) - 1)  # ask() counts the answer itself as one accepted candidate
        return good

    result = ask(
        model, prompts.tasks(level, count, list(docs.values()), documents["initial_state"]), schemas.TASKS,
        check, log, label=f"tasks level {level}", attempts=attempts,
        guide=schemas.tasks_guide(level, count, list(docs.values()), small=small),
    )  # fmt: skip
    return result or []


def extend_toolset(tasks: list[EnvTask], tools: list[str], log: StageLog, *, most: int = 2) -> list[EnvTask]:
    """The toolset-extension operation applied by code: for each task without distractors, a
    variant ``<id>-x`` that also offers 1-``most`` tools it does not need (chosen by a hash of
    the task id, so a rebuild picks the same)."""
    variants = []
    for task in tasks:
        used = {c.name for c in task.gold.calls}
        spare = sorted(set(tools) - used)
        if task.distractors or not spare:
            continue
        rng = random.Random(hashlib.sha256(task.id.encode()).hexdigest())
        distractors = sorted(rng.sample(spare, min(len(spare), rng.randint(1, most))))
        scaling = [*task.complexity.scaling, "toolset_extension"]
        variant = EnvTask.from_dict(
            {**task.to_dict(), "id": f"{task.id}-x", "distractors": distractors,
             "tools": sorted(used) + distractors, "metadata": {**task.metadata, "variant_of": task.id}}
        )  # fmt: skip
        variant.complexity = Complexity.from_calls(
            variant.gold.calls, distractors=len(distractors), scaling=scaling
        )
        variants.append(variant)
    log.accept(len(variants))
    return variants
