"""The procedural generator: every task of every world is solvable, honest and reproducible.

Each check runs on real packs (60 tasks per world, levels 1-4, plain and with the two
generalisation knobs at 0.5) and replays the gold calls through the real tools on a real
copy-on-write world. Gold trajectories are scored
by the real ``tool_use`` reward, in process and behind a real server (uvicorn subprocess
on loopback) that builds the packs from their source.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from protocol import ErrorKind, ToolError, VerifyRequest, decode_results, decode_verify_results
from tests.support.server import running_server, server_config
from tools.envs.pack import Complexity, EnvTask, Pack, PackInfo, call_depths, dump_pack, load_pack
from tools.envs.procedural import WORLDS, derive_answer, pack, tools_module, world_module
from tools.envs.procedural.compose import output_records
from tools.envs.procedural.examples import worked_examples
from tools.envs.procedural.kit import MAX_RESULTS
from tools.verifiers.tool_use.reward import score

TASKS = 60
FUNCTIONAL, TYPED = "functional_generalisation", "parameter_type_generalisation"
SCALED = {FUNCTIONAL: 0.5, TYPED: 0.5}  # both generalisations, beside the plain steps


@pytest.fixture(scope="module", params=[(w, k) for w in WORLDS for k in ("plain", "scaled")], ids=str)
def built(request: pytest.FixtureRequest) -> Pack:
    world, kind = request.param
    return pack(world, seed=0, tasks=TASKS, **(SCALED if kind == "scaled" else {}))


def replay_outputs(p: Pack, task: EnvTask) -> tuple[Any, dict[str, Any]]:
    """The replayed world and each gold call's output by call id (replay runs them by depth)."""
    world = p.replay(task)
    depths = call_depths(task.gold.calls)
    ordered = sorted(task.gold.calls, key=lambda c: depths[c.id])
    assert [c.name for c in ordered] == [r.name for r in world.calls]
    return world, {c.id: r.output for c, r in zip(ordered, world.calls, strict=True)}


def scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in scalars(v)]
    return [value]


def same(answer: str, value: Any) -> bool:
    """An answer string equals a value: numerically for numbers, else case-insensitively."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value).strip().lower() == answer.strip().lower()
    try:
        return math.isclose(float(answer), float(value), abs_tol=0.005)
    except ValueError:
        return False


def test_gold_calls_replay_without_errors(built: Pack) -> None:
    for task in built.tasks:
        world = built.replay(task)
        assert len(world.calls) == len(task.gold.calls)
        assert [c.error for c in world.calls if c.error] == [], task.id


def test_answers_derive_from_the_replayed_outputs(built: Pack) -> None:
    answered = 0
    for task in built.tasks:
        _, outputs = replay_outputs(built, task)
        json.dumps(outputs, allow_nan=False)  # outputs are plain JSON
        leaves = scalars(list(outputs.values()))
        for fact in task.gold.communicate:
            assert any(same(fact, leaf) for leaf in leaves), (task.id, fact)
        if task.gold.answer is None:
            assert task.metadata["derive"] is None
            continue
        answered += 1
        derived = derive_answer(task.metadata["derive"], outputs)
        assert same(task.gold.answer, derived), (task.id, task.gold.answer, derived)
        assert "answer" in task.reward_basis
    assert answered >= TASKS // 4


def test_write_tasks_change_the_state_and_read_tasks_do_not(built: Pack) -> None:
    writers = {t.name for t in built.tools if t.writes}
    kinds = set()
    for task in built.tasks:
        writes = task.metadata["writes"]
        kinds.add(writes)
        assert writes == any(c.name in writers for c in task.gold.calls), task.id
        changed = built.replay(task).changed()
        assert bool(changed) == writes, (task.id, changed)
        assert task.reward_basis[:2] == ["calls", "state"]  # state on every task: an unasked write fails it
    assert kinds == {True, False}


def test_levels_and_complexity_agree_with_the_calls(built: Pack) -> None:
    assert {t.complexity.level for t in built.tasks} == {1, 2, 3, 4}
    for task in built.tasks:
        again = Complexity.from_calls(
            task.gold.calls, distractors=len(task.distractors), scaling=task.complexity.scaling
        )
        assert again == task.complexity, task.id
        if task.complexity.level >= 3:
            assert any(c.depends_on for c in task.gold.calls)


def test_task_tools_exist_and_distractors_are_never_gold(built: Pack) -> None:
    names = [t.name for t in built.tools]
    typed = "-pt" in built.id  # parameter-type generalisation adds two tools per world
    assert 5 <= len(names) <= 8 + 2 * typed
    for task in built.tasks:
        assert task.tools is not None and set(task.tools) <= set(names), task.id
        used = {c.name for c in task.gold.calls}
        assert used <= set(task.tools)
        assert set(task.distractors) <= set(task.tools) and not set(task.distractors) & used
        assert ("toolset_extension" in task.complexity.scaling) == bool(task.distractors)
        if task.complexity.level == 4:
            assert len(task.distractors) == 2


def test_schemas_are_valid_and_gold_arguments_follow_them(built: Pack) -> None:
    for tool in built.tools:
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        for name, prop in tool.input_schema["properties"].items():
            assert prop.get("type") and prop.get("description"), (tool.name, name)
    validators = {t.name: jsonschema.Draft202012Validator(t.input_schema) for t in built.tools}
    for task in built.tasks:
        for call in task.gold.calls:
            errors = [e.message for e in validators[call.name].iter_errors(call.arguments)]
            assert errors == [], (task.id, call.name, errors)
            assert call.compare is None or set(call.compare) <= set(call.arguments)
            compared = set(call.arguments if call.compare is None else call.compare)
            if built.tool(call.name).writes:  # what a write does is decided by all of its arguments
                assert compared == set(call.arguments), (task.id, call)
            else:  # free-text lookups may be phrased another way
                assert not compared & {"query", "name", "owner"}, (task.id, call)


def test_no_tool_leaks_the_answer(built: Pack) -> None:
    """Answers need the gold path: other arguments do not reveal them, lookups alone do not.

    For an answer task, every read tool the task exposes is called on the task's initial
    world with the gold arguments of other tasks that share no argument value with this
    one. None of those outputs may hold the record the answer is read from, or (for an
    answer that is a name) the name itself; a list the answer counts must not come back
    for other arguments. At levels 3-4 the answer must come from calls that depend on a
    lookup.
    """
    readers = {t.name for t in built.tools if not t.writes}
    pool = [(t, c) for t in built.tasks for c in t.gold.calls if c.name in readers]
    checked = 0
    for task in built.tasks:
        if task.gold.answer is None:
            continue
        spec = task.metadata["derive"]
        _, outputs = replay_outputs(built, task)
        subjects = _subject_ids(spec)
        counted = _counted(spec, task, outputs)
        label = task.gold.answer if spec["op"] in ("argmin", "argmax") else None
        mine = {json.dumps(v) for c in task.gold.calls for v in scalars(c.arguments)}
        world = built.new_world(task)
        for other, call in pool:
            if other.id == task.id or call.name not in (task.tools or ()):
                continue
            if mine & {json.dumps(v) for v in scalars(call.arguments)}:
                continue  # related: it names one of this task's entities
            output = built.call(world, call.name, call.arguments)
            ids = {r.get("id") for r in output_records(output)}
            assert len(output_records(output)) <= MAX_RESULTS
            assert not subjects & ids, (task.id, call.name, call.arguments)
            assert (call.name, output) not in counted, (task.id, call.name, call.arguments)
            if label is not None:
                assert label.lower() not in json.dumps(output).lower(), (task.id, call)
            checked += 1
        if task.complexity.level >= 3:
            depths = call_depths(task.gold.calls)
            assert min(depths[c] for c in _spec_calls(spec)) >= 2, task.id
    assert checked > 0


def _spec_calls(spec: dict[str, Any]) -> set[str]:
    if "call" in spec:
        return {spec["call"]}
    return {c for s in spec.get("of", []) for c in _spec_calls(s)}


def _subject_ids(spec: dict[str, Any]) -> set[str]:
    if spec["op"] == "field":
        return {spec["id"]}
    return {i for s in spec.get("of", []) for i in _subject_ids(s)}


def _counted(spec: dict[str, Any], task: EnvTask, outputs: dict[str, Any]) -> list[tuple[str, Any]]:
    """(tool, output) of each non-empty list a count answer counts."""
    if spec["op"] != "count" or not output_records(outputs[spec["call"]]):
        return []
    name = next(c.name for c in task.gold.calls if c.id == spec["call"])
    return [(name, outputs[spec["call"]])]


def test_unknown_ids_are_refused_as_invalid_arguments(built: Pack) -> None:
    refused = 0
    for task in built.tasks:
        for call in task.gold.calls:
            schema = built.tool(call.name).input_schema["properties"]
            for name, value in call.arguments.items():
                if not schema[name].get("pattern", "").endswith(r"-\d+$"):
                    continue  # not an id
                bad = {**call.arguments, name: value.split("-")[0] + "-999999"}
                with pytest.raises(ToolError) as caught:
                    built.call(built.new_world(task), call.name, bad)
                assert caught.value.kind is ErrorKind.INVALID_ARGUMENTS
                assert "999999" in caught.value.message
                refused += 1
    assert refused > 0


def test_parallel_calls_commute(built: Pack) -> None:
    """Calls at one depth run in reverse order: no error, the replay's state, the same answer."""
    for task in built.tasks:
        depths = call_depths(task.gold.calls)
        order = sorted(reversed(task.gold.calls), key=lambda c: depths[c.id])  # stable: reversed per depth
        world = built.new_world(task)
        outputs = {call.id: built.call(world, call.name, call.arguments) for call in order}
        assert world.digest() == built.replay(task).digest(), task.id
        if task.gold.answer is not None:
            assert same(task.gold.answer, derive_answer(task.metadata["derive"], outputs)), task.id


def _refusals(world: str, state: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Requests each world must refuse (a rule of its policy), built from its initial state."""
    first = {name: next(iter(rows.values())) for name, rows in state.items()}
    if world == "shop":
        some, other = [p for p in state["products"].values() if p["stock"] > 0][:2]
        shipped = next(o for o in state["orders"].values() if o["status"] != "placed")
        # the first line could be served: an order is refused whole, no stock moves
        items = [
            {"product_id": some["id"], "quantity": 1},
            {"product_id": other["id"], "quantity": other["stock"] + 1},
        ]
        return [
            ("place_order", {"customer_id": first["customers"]["id"], "items": items}),
            ("cancel_order", {"order_id": shipped["id"]}),
        ]
    if world == "library":
        suspended = next(m for m in state["members"].values() if m["status"] == "suspended")
        late = next(v for v in state["loans"].values() if not v["returned"] and v["due"] < "2026-11-20")
        return [
            ("checkout_book", {"member_id": suspended["id"], "book_id": first["books"]["id"]}),
            ("renew_loan", {"loan_id": late["id"]}),
            ("return_book", {"loan_id": next(v["id"] for v in state["loans"].values() if v["returned"])}),
        ]
    if world == "bank":
        frozen = next(a for a in state["accounts"].values() if a["status"] == "frozen")
        rich = next(a for a in state["accounts"].values() if a["status"] == "open")
        return [
            ("withdraw", {"account_id": rich["id"], "amount": rich["balance"] + 1}),
            ("transfer", {"from_account_id": rich["id"], "to_account_id": frozen["id"], "amount": 1.0}),
            ("freeze_account", {"account_id": frozen["id"]}),
        ]
    event = first["events"]
    clash = {k: event[k] for k in ("title", "date", "start", "end", "room_id")}
    return [
        ("create_event", clash),
        ("add_attendee", {"event_id": event["id"], "person_id": event["attendees"][0]}),
        ("create_event", {**clash, "date": "2026-12-01", "start": "10:00", "end": "09:00"}),
    ]


def test_refusals_are_tool_errors_and_change_nothing(built: Pack) -> None:
    cases = _refusals(built.info.domain, built.initial_state)
    validators = {t.name: jsonschema.Draft202012Validator(t.input_schema) for t in built.tools}
    for name, arguments in cases:
        validators[name].validate(arguments)  # well-formed: the world, not the schema, says no
        world = built.new_world()
        with pytest.raises(ToolError) as caught:
            built.call(world, name, arguments)
        assert caught.value.kind is ErrorKind.TOOL_ERROR, (name, arguments)
        assert world.calls[-1].error and not world.changed(), (name, arguments)


def _gold_trajectory(p: Pack, task: EnvTask, answer: str | None) -> tuple[Any, VerifyRequest]:
    """The session and chat of an agent that makes the gold calls, one turn per depth, then answers."""
    world, outputs = replay_outputs(p, task)
    depths = call_depths(task.gold.calls)
    messages: list[dict[str, Any]] = [*task.prompt]
    for depth in sorted(set(depths.values())):
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        for call in task.gold.calls:
            if depths[call.id] == depth:
                messages.append({"role": "tool", "name": call.name, "content": json.dumps(outputs[call.id])})
    final = "Done. " + " ".join(task.gold.communicate)
    if answer is not None:
        final += f" <answer>{answer}</answer>"
    messages.append({"role": "assistant", "content": final})
    ground_truth = {"pack": p.id, "task": task.id}
    return world, VerifyRequest("tool_use", ground_truth, messages=messages, response_start=len(task.prompt))


def test_the_tool_use_reward_gives_gold_trajectories_full_marks(built: Pack) -> None:
    for task in built.tasks:
        world, request = _gold_trajectory(built, task, task.gold.answer)
        for mode in ("train", "eval"):
            result = score(built, task, world, request, mode=mode)
            assert result.score == 1.0, (task.id, mode, result.components)
        if task.gold.answer is not None:  # and a wrong answer fails the task
            world, request = _gold_trajectory(built, task, "no idea")
            assert score(built, task, world, request, mode="eval").score == 0.0, task.id


def test_the_same_arguments_give_the_same_pack_and_other_seeds_differ() -> None:
    for world in WORLDS:
        a, b, c = pack(world, 3, 24), pack(world, 3, 24), pack(world, 4, 24)
        assert [t.to_dict() for t in a.tasks] == [t.to_dict() for t in b.tasks]
        assert json.dumps(a.initial_state, sort_keys=True) == json.dumps(b.initial_state, sort_keys=True)
        assert a.initial_state != c.initial_state
        assert [t.prompt for t in a.tasks] != [t.prompt for t in c.tasks]
        assert [t.to_dict() for t in pack(world, 3, 8).tasks] == [t.to_dict() for t in a.tasks[:8]]


def test_levels_option_builds_a_training_pack_of_levels_1_and_2() -> None:
    p = pack("shop", seed=1, tasks=30, levels=[1, 2])
    assert {t.complexity.level for t in p.tasks} == {1, 2}
    assert [t.to_dict() for t in pack("shop", seed=1, tasks=30, levels="1,2").tasks] == [
        t.to_dict() for t in p.tasks
    ]
    assert {t.complexity.level for t in pack("shop", seed=1, tasks=5, levels=3).tasks} == {3}
    assert len(p.tasks) == 30 and p.id != pack("shop", seed=1, tasks=4).id
    assert all(len(t.prompt[0]["content"]) < 160 for t in p.tasks)


@pytest.mark.parametrize("world", WORLDS)
def test_scaling_options_change_the_tasks(world: str) -> None:
    plain = pack(world, 0, 40, parameter_expansion=0.0, toolset_extension=0.0, distractors=0)
    assert not any(t.complexity.scaling or t.distractors for t in plain.tasks)
    wide = pack(world, 0, 40, parameter_expansion=1.0, toolset_extension=1.0, distractors=3)
    assert all(len(t.distractors) == 3 for t in wide.tasks)
    expanded = [t for t in wide.tasks if "parameter_expansion" in t.complexity.scaling]
    assert expanded
    for task in expanded:  # some gold call passes an optional parameter
        assert any(
            set(c.arguments) - set(wide.tool(c.name).input_schema["required"]) for c in task.gold.calls
        ), task.id


@pytest.mark.parametrize("world", WORLDS)
def test_patched_tasks_start_from_another_world(world: str) -> None:
    assert not any(t.state_patch for t in pack(world, 0, 40, patched=0.0).tasks)
    p = pack(world, 0, 80, patched=1.0)
    assert all(t.state_patch for t in p.tasks)
    differs = 0
    for task in p.tasks:
        assert p.base_state(task) != p.initial_state
        if task.gold.answer is None:
            continue
        unpatched = p.new_world()
        outputs = {}
        depths = call_depths(task.gold.calls)
        for call in sorted(task.gold.calls, key=lambda c: depths[c.id]):
            try:
                outputs[call.id] = p.call(unpatched, call.name, call.arguments)
            except ToolError:
                outputs[call.id] = None
        try:
            differs += not same(task.gold.answer, derive_answer(task.metadata["derive"], outputs))
        except (KeyError, TypeError):
            differs += 1
    assert differs > 0  # the patch matters: some answers are not those of the initial state


@pytest.mark.parametrize("world", WORLDS)
def test_dump_and_load_round_trip(world: str, tmp_path: Any) -> None:
    p = pack(world, 2, 16)
    loaded = load_pack(dump_pack(p, tmp_path / world, tools_module=tools_module(world)))
    assert loaded.id == p.id and loaded.policy == p.policy and loaded.info.origin == "procedural"
    assert [t.name for t in loaded.tools] == [t.name for t in p.tools]
    assert loaded.initial_state == p.initial_state
    assert [t.to_dict() for t in loaded.tasks] == [t.to_dict() for t in p.tasks]
    for mine, theirs in zip(p.tasks, loaded.tasks, strict=True):
        assert p.replay(mine).digest() == loaded.replay(theirs).digest()


def test_bad_generator_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown procedural world"):
        pack("zoo")
    for levels in ([5], [], "1,x", 0):
        with pytest.raises(ValueError, match="levels must be some of"):
            pack("shop", levels=levels)
    with pytest.raises(ValueError, match="tasks must be"):
        pack("shop", tasks=-1)
    with pytest.raises(ValueError, match="seed must be"):
        pack("shop", seed="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="parameter_expansion"):
        pack("shop", parameter_expansion=2.0)
    for name, value in ((FUNCTIONAL, 1.5), (TYPED, -0.1), (TYPED, "half")):
        with pytest.raises(ValueError, match=name):
            pack("shop", **{name: value})


def test_policies_say_who_the_agent_is_and_the_global_rng_is_untouched() -> None:
    before = random.getstate()
    for world in WORLDS:
        p = pack(world, 0, 4)
        assert p.policy.startswith("You are") and len(p.tasks) == 4
    assert random.getstate() == before  # the generator never draws from the global rng


def test_packs_are_the_same_in_other_processes() -> None:
    """No hash order or global state leaks in: two interpreters with other hash seeds agree."""
    code = (
        "import hashlib, json; from tools.envs.procedural import WORLDS, pack; "
        "print(hashlib.sha256(json.dumps([[t.to_dict() for t in p.tasks] + [p.initial_state] "
        "for w in WORLDS for p in (pack(w, 5, 40), pack(w, 5, 40, functional_generalisation=0.5, "
        "parameter_type_generalisation=0.5))], sort_keys=True).encode()).hexdigest())"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        digests.add(run.stdout.strip())
    assert len(digests) == 1


@pytest.mark.parametrize("world", WORLDS)
def test_worked_examples_are_solved_chats_beside_the_tasks(world: str) -> None:
    p = pack(world, 0, 100, levels=[1, 2])
    chats = worked_examples(p, count=4)
    assert len(chats) == 4 and chats == worked_examples(p, count=4)
    prompts = {t.prompt[0]["content"] for t in p.tasks}
    assert len({c[0]["content"] for c in chats}) == 4
    for chat in chats:
        assert chat[0]["role"] == "user" and chat[0]["content"] not in prompts
        assert chat[-1]["role"] == "assistant" and chat[-1]["content"]
        called = [tc["function"] for m in chat if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
        results = [m for m in chat if m["role"] == "tool"]
        assert 1 <= len(called) <= 2 and [c["name"] for c in called] == [m["name"] for m in results]
        for result in results:
            assert not isinstance(json.loads(result["content"]), str)  # a tool output, not an error text
    with pytest.raises(ValueError, match="not procedural"):
        worked_examples(Pack(PackInfo("hand-made"), p.tools, p.initial_state))


@pytest.mark.parametrize("world", WORLDS)
def test_worked_examples_of_a_generalised_pack_show_its_generalisations(world: str) -> None:
    p = pack(world, 0, 100, levels=[1, 2], **SCALED)
    chats = worked_examples(p, count=16)  # enough, for this seed, to show both in every world
    tools = {t.name: t for t in p.tools}
    typed = {t.name for t in p.tools} - {t.name for t in world_module(world).TOOLS}
    called = [
        tc["function"] for c in chats for m in c if m["role"] == "assistant" for tc in m.get("tool_calls", [])
    ]
    for call in called:
        jsonschema.validate(call["arguments"], tools[call["name"]].input_schema)
    assert {c["name"] for c in called} & typed  # some example calls a richer-typed tool
    assert any(c[-1]["content"] in ("yes", "no") for c in chats)  # and one answers a goal
    plain = pack(world, 0, 100, levels=[1, 2])
    assert worked_examples(plain, count=8) == worked_examples(pack(world, 0, 100, levels=[1, 2]), count=8)


def _served_session(http: httpx.Client, p: Pack, task: EnvTask) -> dict[str, Any]:
    """Play ``task``'s gold calls in a session bound to it; the verify request for that session."""
    session, truth = f"s-{task.id}", {"pack": p.id, "task": task.id}
    opened = http.post("/v1/sessions", json={"session": session, "environment": truth})
    assert opened.status_code == 201, opened.text
    _, outputs = replay_outputs(p, task)
    depths = call_depths(task.gold.calls)
    messages: list[dict[str, Any]] = [*task.prompt]
    for call in sorted(task.gold.calls, key=lambda c: depths[c.id]):
        sent = {"call_id": f"{session}-{call.id}", "name": call.name, "arguments": call.arguments}
        result = decode_results(
            http.post("/v1/calls", json={"calls": [{**sent, "session": session}]}).content
        )[0]
        assert not result.is_error and result.structured == outputs[call.id], (task.id, result)
        text = json.dumps({"name": call.name, "arguments": call.arguments})
        messages.append({"role": "assistant", "content": f"<tool_call>{text}</tool_call>"})
        messages.append({"role": "tool", "name": call.name, "content": result.text})
    final = " ".join(["Done.", *task.gold.communicate])
    if task.gold.answer is not None:
        final += f" <answer>{task.gold.answer}</answer>"
    messages.append({"role": "assistant", "content": final})
    return {"verifier": "tool_use", "ground_truth": truth, "session": session, "messages": messages,
            "response_start": len(task.prompt), "arguments": {"mode": "eval"}}  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize("knobs", [{}, {**SCALED, TYPED: 1.0}], ids=["plain", "generalised"])
def test_a_real_server_serves_the_packs_and_scores_gold_sessions_full(knobs: dict[str, float]) -> None:
    """The four worlds from their source behind a real server, plain and generalised (list and
    object arguments over the wire): schemas, bound sessions, the reward."""
    token = "procedural-" + "p" * 24
    arguments = [{"world": world, "seed": 7, "tasks": 8, **knobs} for world in WORLDS]
    config = server_config(
        environments=[{"source": "tools.envs.procedural:pack", "arguments": a} for a in arguments]
    )
    with (
        running_server(config, env={"TOOLFACTORY_TOKENS": token}) as srv,
        httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
    ):
        typed = 0  # gold calls of the richer-typed tools (lists and objects over the wire)
        for argument in arguments:
            p = pack(**argument)
            plain = {t.name for t in world_module(argument["world"]).TOOLS}
            typed += sum(c.name not in plain for t in p.tasks for c in t.gold.calls)
            listed = http.get("/v1/tools", params={"toolset": p.id}).json()["tools"]
            assert {t["name"]: t["inputSchema"] for t in listed} == {t.name: t.input_schema for t in p.tools}
            for task in p.tasks:
                request = _served_session(http, p, task)
                reply = http.post("/v1/verify", json={"requests": [request]})
                verdict = decode_verify_results(reply.content)[0]
                assert not verdict.is_error and verdict.score == 1.0, (task.id, verdict.components)
                assert http.delete(f"/v1/sessions/{request['session']}").status_code == 200
    assert (typed > 0) == bool(knobs)


# --------------------------------------------------------------------------- the generalisation knobs

# sha256 of dump_pack's files and the tool descriptors of packs built before the
# generalisation knobs existed: at 0 (the default) the knobs must not change one byte.
# A learning run and other tests depend on these packs: change a digest only on purpose.
PINNED = [
    (("shop", 0, 40, (1, 2, 3, 4)), {}, "8dfbb0f6c82117ea302fab030dc03fe0dc3d5c165618cdab2560005776046074"),
    (("library", 1, 30, (1, 2)), {}, "51308b3069e78b3562ced7dde09aa7ba8cf29cf02405151eda37e08bc10ff91d"),
    (
        ("bank", 2, 30, (1, 2, 3, 4)),
        {"toolset_extension": 0.5, "parameter_expansion": 1.0},
        "faa78dc5422958852f3f4c4d5eb2c962d680b484c5dfc17c65704b47ca364925",
    ),
    (
        ("calendar", 3, 30, (3, 4)),
        {"patched": 0.0, "distractors": 3},
        "5c479cb131452a66f951984bf6902ad5777ad1c4a2940e02202fbf7a6555fd45",
    ),
    (("bank", 0, 24, (1, 2)), {}, "4db7e482c4e6cac2c5a756fbff72c53544fde8be8b927c15eea55d477cd3a9ce"),
]


def _pack_digest(p: Pack, module: str) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        root = dump_pack(p, Path(scratch) / "p", tools_module=module)
        digest = hashlib.sha256()
        for name in sorted(f.name for f in root.iterdir()):
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    digest.update(json.dumps([t.descriptor() for t in p.tools], sort_keys=True).encode())
    return digest.hexdigest()


@pytest.mark.parametrize(("arguments", "options", "expected"), PINNED)
def test_default_packs_are_byte_identical_to_those_before_the_knobs(
    arguments: tuple[Any, ...], options: dict[str, Any], expected: str
) -> None:
    world = arguments[0]
    why = (
        "a default procedural pack changed (tasks, ids, gold, state or tools): a learning run depends "
        "on them; if dump_pack's format or a world changed on purpose, pin the new digest"
    )
    assert _pack_digest(pack(*arguments, **options), tools_module(world)) == expected, why
    zeros = {FUNCTIONAL: 0.0, TYPED: 0}  # given explicitly as 0: the same pack, the same id
    assert _pack_digest(pack(*arguments, **options, **zeros), tools_module(world)) == expected, why


def _containers(value: Any) -> bool:
    return isinstance(value, list | dict)


@pytest.mark.parametrize("world", WORLDS)
def test_functional_generalisation_asks_for_a_goal_with_the_same_tools(world: str) -> None:
    plain = pack(world, 0, 40)
    p = pack(world, 0, 40, functional_generalisation=1.0)
    assert p.id == f"{plain.id}-f1" and [t.name for t in p.tools] == [t.name for t in plain.tools]
    variants = {f.__name__ for fs in world_module(world).FUNCTIONAL_STEPS.values() for f in fs}
    tagged = [t for t in p.tasks if FUNCTIONAL in t.complexity.scaling]
    assert len(tagged) >= len(p.tasks) // 3
    answers = set()
    for task in tagged:
        assert set(task.metadata["steps"]) & variants, task.id
        if task.gold.answer is not None:
            answers.add(task.gold.answer)
            _, outputs = replay_outputs(p, task)
            assert derive_answer(task.metadata["derive"], outputs) == task.gold.answer
    assert answers == {"yes", "no"}  # a goal is met or not: both occur
    assert not any(FUNCTIONAL in t.complexity.scaling for t in plain.tasks)


@pytest.mark.parametrize("world", WORLDS)
def test_parameter_type_generalisation_calls_tools_with_lists_and_objects(world: str, tmp_path: Path) -> None:
    plain = pack(world, 0, 40)
    p = pack(world, 0, 40, parameter_type_generalisation=1.0)
    assert p.id == f"{plain.id}-pt1"
    added = [t for t in p.tools if t.name not in {u.name for u in plain.tools}]
    assert [t.descriptor() for t in p.tools[: len(plain.tools)]] == [t.descriptor() for t in plain.tools]
    assert len(added) == 2 and not any(t.writes for t in added)
    for tool in added:  # a list of ids (a set: order-free), or a range object / list of enums
        rich = [v for v in tool.input_schema["properties"].values() if v["type"] in ("array", "object")]
        assert rich and all(v.get("uniqueItems") for v in rich if v["type"] == "array"), tool.name
    tagged = [t for t in p.tasks if TYPED in t.complexity.scaling]
    assert {t.complexity.level for t in tagged} >= {1, 3} and len(tagged) >= len(p.tasks) // 3
    for task in tagged:
        rich = [c for c in task.gold.calls if any(_containers(v) for v in c.arguments.values())]
        assert rich and {c.name for c in rich} <= {t.name for t in added}, task.id
    # the directory form names the typed module, and reads back the same pack
    loaded = load_pack(dump_pack(p, tmp_path / world, tools_module=tools_module(world, typed=True)))
    assert [t.descriptor() for t in loaded.tools] == [t.descriptor() for t in p.tools]
    assert [t.to_dict() for t in loaded.tasks] == [t.to_dict() for t in p.tasks]


def _played(p: Pack, task: EnvTask, change: Any) -> tuple[Any, VerifyRequest]:
    """A session that makes the gold calls with ``change(call)``'s arguments, then answers right."""
    world = p.new_world(task)
    depths = call_depths(task.gold.calls)
    messages: list[dict[str, Any]] = [*task.prompt]
    for call in sorted(task.gold.calls, key=lambda c: depths[c.id]):
        arguments = change(call)
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        try:
            output = p.call(world, call.name, arguments)
        except ToolError as exc:
            output = str(exc)
        messages.append({"role": "tool", "name": call.name, "content": json.dumps(output)})
    final = " ".join(["Done.", *task.gold.communicate])
    if task.gold.answer is not None:
        final += f" <answer>{task.gold.answer}</answer>"
    messages.append({"role": "assistant", "content": final})
    truth = {"pack": p.id, "task": task.id}
    return world, VerifyRequest("tool_use", truth, messages=messages, response_start=len(task.prompt))


def _reordered(call: Any) -> dict[str, Any]:
    return {k: v[::-1] if isinstance(v, list) else v for k, v in call.arguments.items()}


def _narrowed(call: Any) -> dict[str, Any]:
    """One id fewer in a list; a range bound moved (a day, or one euro)."""
    out = dict(call.arguments)
    for key, value in call.arguments.items():
        if isinstance(value, list) and len(value) > 1:
            out[key] = value[1:]
        elif isinstance(value, dict):
            low = next(iter(value))
            bound = value[low]
            moved = bound + 1 if isinstance(bound, int | float) else bound[:-2] + "00"
            out[key] = {**value, low: moved}
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_the_reward_reads_list_arguments_as_sets_and_compares_objects(world: str) -> None:
    p = pack(world, 0, 40, parameter_type_generalisation=1.0)
    lists = objects = 0
    for task in (t for t in p.tasks if TYPED in t.complexity.scaling):
        session, request = _played(p, task, _reordered)
        assert score(p, task, session, request, mode="eval").score == 1.0, task.id
        session, request = _played(p, task, _narrowed)
        changed = any(_narrowed(c) != c.arguments for c in task.gold.calls)
        if changed:
            result = score(p, task, session, request, mode="eval")
            assert result.score == 0.0 and result.components["matched"] < 1.0, task.id
            arguments = [v for c in task.gold.calls for v in c.arguments.values()]
            lists += any(isinstance(v, list) for v in arguments)
            objects += any(isinstance(v, dict) for v in arguments)
    assert lists > 0 and (objects > 0 or world == "shop")  # the shop's filter is a list of enums
