"""The BFCL multi-turn import against BFCL itself (the installed ``bfcl-eval``, no stand-ins).

Parity is the point: replaying an entry's ground truth through our pack (BFCL's API
classes over a copy-on-write World, methods called by keyword) must produce the call
results and the final state that BFCL's own executor produces from the same calls,
judged by BFCL's own ``state_checker``; a trajectory missing a write must fail both.
BFCL's executor ``eval``s call strings: only the tests run it, on BFCL's own data.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import decimal
import inspect
import json
import random
import re
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import mpmath
import pytest

from tests.support.require import require

require("bfcl_eval", reason="bfcl-eval is installed by `make setup` (pip install --no-deps)")

from bfcl_eval.constants.category_mapping import VERSION_PREFIX  # noqa: E402
from bfcl_eval.constants.eval_config import PROMPT_PATH  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # noqa: E402
    multi_turn_checker,
    state_checker,
)
from bfcl_eval.utils import populate_test_cases_with_predefined_functions  # noqa: E402

from protocol import ErrorKind, ToolError, VerifyRequest, decode_results  # noqa: E402
from tests.support.server import ServerProcess, running_server, server_config  # noqa: E402
from tools.envs.bfcl import packs as bfcl  # noqa: E402
from tools.envs.bfcl.data import (  # noqa: E402
    CATEGORIES,
    Entry,
    entries,
    function_docs,
    parse_call,
    to_json_schema,
)
from tools.envs.bfcl.state import api_class, comparable, load_instance  # noqa: E402
from tools.envs.pack import EnvTask, GoldCall, Pack  # noqa: E402
from tools.envs.world import World  # noqa: E402
from tools.verifiers.tool_use.reward import DEFAULT_WEIGHTS, score  # noqa: E402

pytestmark = pytest.mark.timeout(600)
WEIGHTED = set(DEFAULT_WEIGHTS) - {"penalty"}  # the components a train score sums (1.0 at best)
OWNER = {doc["name"]: name for name, docs in function_docs().items() for doc in docs}  # function -> class


@pytest.fixture(autouse=True)
def _process_precision_kept() -> Iterator[None]:
    """BFCL's own executor (run here for comparison) leaves mpmath's and decimal's precision
    where its last logarithm or square_root put them: not for the tests that follow."""
    with decimal.localcontext():
        precision = mpmath.mp.prec
        yield
        mpmath.mp.prec = precision


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {category: bfcl.pack(category) for category in CATEGORIES}


@pytest.fixture(scope="module")
def bfcl_entries() -> dict[str, dict[str, Entry]]:
    return {category: {e.id: e for e in entries(category)} for category in CATEGORIES}


# --------------------------------------------------------------------------- BFCL's side


@dataclass
class BfclRun:
    results: list[str]  # one string per call, as BFCL renders them
    instances: dict[str, Any]


def run_bfcl(entry: Entry, category: str, turns: Sequence[Sequence[str]]) -> BfclRun:
    """BFCL's own executor on ``turns`` of call strings, from a fresh scenario.

    The executor keeps instances in its module's globals under the model name and the
    entry id (that is how a later turn finds the earlier turns' state); a fresh model
    name per run keeps runs apart, and they are removed afterwards.
    """
    name = f"toolfactory_{uuid.uuid4().hex}"
    results: list[str] = []
    instances: dict[str, Any] = {}
    try:
        for turn in turns:
            out, instances = multi_turn_utils.execute_multi_turn_func_call(
                list(turn),
                entry.initial_config,
                entry.involved_classes,
                name,
                entry.id,
                long_context="long_context" in category,
                is_evaL_run=True,
            )
            results.extend(out)
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]
    return BfclRun(results, instances)


def bfcl_failed(result: str) -> bool:
    """Whether BFCL's rendering of a call result is an error (raised, or an ``{"error"}`` answer)."""
    if result.startswith("Error during execution"):
        return True
    with contextlib.suppress(ValueError):
        value = json.loads(result)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        return isinstance(value, dict) and set(value) == {"error"}
    return False


def bfcl_value(result: str) -> Any:
    """BFCL's result string as JSON data: it is ``json.dumps`` of a dict or ``str`` of anything else."""
    with contextlib.suppress(ValueError):
        return json.loads(result)
    text = re.sub(r"mpf\('([^']*)'\)", r"\1", result)  # MathAPI's mpmath numbers
    text = text.replace(", Ellipsis]", ", 'Ellipsis']")  # a long-context list ends with the ... object
    with contextlib.suppress(ValueError, SyntaxError):
        return json.loads(json.dumps(ast.literal_eval(text)))
    return result


def turns_of(task: EnvTask, entry: Entry, calls: Sequence[GoldCall]) -> list[list[str]]:
    """``calls`` (a subset of the gold) in the task's turns, as BFCL's own ground-truth strings.

    BFCL gets its original strings (not ours re-rendered), so a wrong reading of them
    (a positional argument given the wrong name) shows up as a disagreement.
    """
    original = dict(
        zip(
            (i for ids in task.metadata["turn_calls"] for i in ids),
            (s for turn in entry.ground_truth for s in turn),
            strict=True,
        )
    )
    keep = {c.id for c in calls}
    return [[original[i] for i in ids if i in keep] for ids in task.metadata["turn_calls"]]


def bfcl_offers(category: str) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    """Per entry, the functions BFCL's runner offers at the start and those it reveals later."""
    with open(PROMPT_PATH / f"{VERSION_PREFIX}_{category}.json") as handle:
        rows = populate_test_cases_with_predefined_functions([json.loads(line) for line in handle])
    offered = {row["id"]: [doc["name"] for doc in row["function"]] for row in rows}
    revealed = {
        row["id"]: {
            turn: [doc["name"] for doc in docs] for turn, docs in row.get("missed_function", {}).items()
        }
        for row in rows
    }
    return offered, revealed


def gold_calls(task: EnvTask, ids: Sequence[str]) -> list[GoldCall]:
    by_id = {c.id: c for c in task.gold.calls}
    return [by_id[i] for i in ids]


def run_ours(pack: Pack, task: EnvTask, calls: Sequence[GoldCall]) -> World:
    world = pack.new_world(task)
    for call in calls:
        with contextlib.suppress(ToolError):
            pack.call(world, call.name, call.arguments)
    return world


def our_instances(world: World, entry: Entry) -> dict[str, Any]:
    table = world[bfcl.TABLE]
    return {name: table[name] for name in entry.involved_classes}


# --------------------------------------------------------------------------- shape


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_entry_is_a_task_with_its_turns_and_a_chained_gold(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]], category: str
) -> None:
    pack = packs[category]
    assert pack.id == f"bfcl_{category}" and pack.info.origin == "bfcl"
    assert len(pack.tasks) == len(bfcl_entries[category]) == 200
    offered, revealed = bfcl_offers(category)
    early: list[str] = []  # entries whose gold calls a held-out function before it is revealed
    for task in pack.tasks:
        entry = bfcl_entries[category][task.id]
        assert task.prompt == entry.turns[0] and task.prompt
        assert len(task.metadata["turns"]) == len(entry.turns) - 1
        assert all(messages for messages in task.metadata["turns"])  # miss_func turns get BFCL's text
        ids = [c.id for c in task.gold.calls]
        assert [i for turn in task.metadata["turn_calls"] for i in turn] == ids
        assert [len(t) for t in task.metadata["turn_calls"]] == [len(t) for t in entry.ground_truth]
        assert all(c.depends_on == ([ids[n - 1]] if n else []) for n, c in enumerate(task.gold.calls))
        assert task.complexity.depth == len(ids) and task.complexity.gold_calls == len(ids)
        # what BFCL's runner puts in front of the model, then what it reveals later
        later = [n for names in revealed[task.id].values() for n in names]
        assert sorted(task.tools or ()) == sorted(offered[task.id] + later)
        assert task.metadata["tools_added"] == revealed[task.id]
        for turn, added in task.metadata["tools_added"].items():
            assert int(turn) > 0
            earlier = {
                c.name for ids in task.metadata["turn_calls"][: int(turn)] for c in gold_calls(task, ids)
            }
            if set(added) & earlier:
                early.append(task.id)
        assert {c.name for c in task.gold.calls} <= set(task.tools or ())
        assert EnvTask.from_dict(json.loads(json.dumps(task.to_dict()))) == task  # plain JSON
    if category == "multi_turn_miss_func":
        assert all(task.metadata["tools_added"] for task in pack.tasks)
        # BFCL's data: entry 49 holds tail back until turn 3, but its turn-1 gold calls tail
        assert early == ["multi_turn_miss_func_49"]
    else:
        assert early == []


def test_positional_ground_truth_gets_the_methods_parameter_names(packs: dict[str, Pack]) -> None:
    task = packs["multi_turn_base"].task("multi_turn_base_0")
    assert GoldCall("sort", {"file_name": "final_report.pdf"}, id="t2c0", depends_on=["t1c1"]) in (
        task.gold.calls
    )
    order = {"mv": ["source", "destination"]}
    assert parse_call("mv('a', destination='b')", order) == ("mv", {"source": "a", "destination": "b"})
    for bad in (
        "mv(__import__('os').system('true'))",  # not a literal: never evaluated
        "os.system('true')",
        "exit()",
        "mv('a', 'b', 'c')",
        "mv('a', source='b')",
        "mv(",
    ):
        with pytest.raises(ValueError):
            parse_call(bad, order)


@pytest.mark.parametrize("category", CATEGORIES)
def test_gold_arguments_fit_the_tool_schemas(packs: dict[str, Pack], category: str) -> None:
    pack = packs[category]
    schemas = {t.name: t.input_schema for t in pack.tools}
    price = schemas["place_order"]["properties"]["price"]  # BFCL's float: a number that says it is one
    assert price["type"] == "number" and price["description"].endswith(" This is a float type value.")
    assert schemas["mean"]["properties"]["numbers"]["items"] == {"type": "number"}
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    docs = {
        doc["name"]: to_json_schema(doc["parameters"]) for docs in function_docs().values() for doc in docs
    }
    misfits, doc_misfits = [], []
    for task in pack.tasks:
        for call in task.gold.calls:
            errors = list(jsonschema.Draft202012Validator(schemas[call.name]).iter_errors(call.arguments))
            if errors:
                misfits.append((task.id, call.name, errors[0].message))
            errors = list(jsonschema.Draft202012Validator(docs[call.name]).iter_errors(call.arguments))
            if errors:
                doc_misfits.append((task.id, call.name, errors[0].message))
    # BFCL's data: entry 173's gold closes ticket 'ticket_001', where the doc says integer ids
    # (BFCL checks no type); the served schema takes what BFCL's method takes, so it fits
    assert doc_misfits == [(f"{category}_173", "close_ticket", "'ticket_001' is not of type 'integer'")]
    assert misfits == []
    widened = [
        (t.name, p)
        for t in pack.tools
        for p, s in t.input_schema["properties"].items()
        if s != docs[t.name]["properties"][p]
    ]
    assert sorted(widened) == [
        (f, "ticket_id") for f in ("close_ticket", "edit_ticket", "get_ticket", "resolve_ticket")
    ]
    assert schemas["close_ticket"]["properties"]["ticket_id"]["type"] == ["integer", "string"]


# --------------------------------------------------------------------------- parity with BFCL


@pytest.mark.parametrize("category", CATEGORIES)
def test_gold_replay_matches_bfcls_own_execution(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]], category: str
) -> None:
    """Every call fails where BFCL's fails, returns what BFCL's returns, and ends in BFCL's state."""
    pack = packs[category]
    calls = error_mismatch = output_mismatch = 0
    state_mismatch: list[str] = []
    for task in pack.tasks:
        entry = bfcl_entries[category][task.id]
        ours = pack.replay(task)
        theirs = run_bfcl(entry, category, turns_of(task, entry, task.gold.calls))
        for record, result in zip(ours.calls, theirs.results, strict=True):
            calls += 1
            error_mismatch += (record.error is not None) != bfcl_failed(result)
            output_mismatch += record.error is None and record.output != bfcl_value(result)
        mine = our_instances(ours, entry)
        if not state_checker(mine, theirs.instances)["valid"] or any(
            comparable(mine[n]) != comparable(theirs.instances[n]) for n in mine
        ):
            state_mismatch.append(task.id)
    assert calls == sum(len(t.gold.calls) for t in pack.tasks) > 1000
    assert (error_mismatch, output_mismatch, state_mismatch) == (0, 0, [])


def test_replays_repeat_and_leave_the_gold_alone(packs: dict[str, Pack]) -> None:
    """Methods keep the objects they are given: calls must hand them copies, not the gold's."""
    pack = packs["multi_turn_base"]
    fresh = bfcl.pack("multi_turn_base")
    for task in pack.tasks:
        assert pack.replay(task).digest() == pack.replay(task).digest()
    assert [t.gold for t in pack.tasks] == [t.gold for t in fresh.tasks]


def test_broken_trajectories_fail_the_same_way_in_both(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    """The gold turns in reverse order: many calls fail; errors and final states still agree."""
    category = "multi_turn_base"
    pack = packs[category]
    failures = error_mismatch = 0
    state_mismatch = []
    for task in pack.tasks:
        entry = bfcl_entries[category][task.id]
        by_id = {c.id: c for c in task.gold.calls}
        reversed_calls = [by_id[i] for ids in reversed(task.metadata["turn_calls"]) for i in ids]
        ours = run_ours(pack, task, reversed_calls)
        theirs = run_bfcl(entry, category, [[s for turn in reversed(entry.ground_truth) for s in turn]])
        for record, result in zip(ours.calls, theirs.results, strict=True):
            failures += record.error is not None
            error_mismatch += (record.error is not None) != bfcl_failed(result)
        if not state_checker(our_instances(ours, entry), theirs.instances)["valid"]:
            state_mismatch.append(task.id)
    assert failures > 50  # the reordering does break things
    assert (error_mismatch, state_mismatch) == (0, [])


def test_random_trajectories_fail_and_end_the_same_way_in_both(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    """Eight calls per task drawn from all gold calls of its tools (seeded): wrong ids, missing
    files, calls before a login. Errors, results and final states still agree with BFCL's."""
    category = "multi_turn_base"
    pack = packs[category]
    pool: dict[str, list[GoldCall]] = {}
    for task in pack.tasks:
        for call in task.gold.calls:
            pool.setdefault(call.name, []).append(call)
    rng = random.Random(7)
    calls = failures = error_mismatch = output_mismatch = 0
    state_mismatch = []
    for task in pack.tasks:
        entry = bfcl_entries[category][task.id]
        names = [name for name in task.tools or () if name in pool]
        drawn = [rng.choice(pool[rng.choice(names)]) for _ in range(8)]
        ours = run_ours(pack, task, drawn)
        theirs = run_bfcl(entry, category, [[written_out(c) for c in drawn]])
        for record, result in zip(ours.calls, theirs.results, strict=True):
            calls += 1
            failures += record.error is not None
            error_mismatch += (record.error is not None) != bfcl_failed(result)
            output_mismatch += record.error is None and record.output != bfcl_value(result)
        if not state_checker(our_instances(ours, entry), theirs.instances)["valid"]:
            state_mismatch.append(task.id)
    assert calls == 1600 and failures > 300
    assert (error_mismatch, output_mismatch, state_mismatch) == (0, 0, [])


def written_out(call: GoldCall) -> str:
    """``call`` as a BFCL string with every default written out.

    post_tweet's ``mentions=[]`` default is one list for the whole process, and mention
    extends it, so BFCL's results depend on what ran before; ours get fresh defaults.
    """
    method = getattr(api_class(OWNER[call.name]), call.name)
    bound = inspect.signature(method).bind(None, **call.arguments)  # None: self
    bound.apply_defaults()
    arguments = {k: copy.deepcopy(v) for k, v in list(bound.arguments.items())[1:]}
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


@pytest.mark.parametrize("category", CATEGORIES)
def test_a_missing_write_is_caught_by_both_state_checks(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]], category: str
) -> None:
    """Drop each write call of every 4th task: World.differences and BFCL's state checker agree."""
    pack = packs[category]
    drops = caught = disagree = 0
    for task in pack.tasks[::4]:
        entry = bfcl_entries[category][task.id]
        gold_world = pack.replay(task)
        gold_run = run_bfcl(entry, category, entry.ground_truth)
        for kept in without_one_write(pack, task):
            ours = run_ours(pack, task, kept)
            theirs = run_bfcl(entry, category, turns_of(task, entry, kept))
            we_differ = bool(ours.differences(gold_world))
            they_differ = not state_checker(theirs.instances, gold_run.instances)["valid"]
            drops += 1
            caught += we_differ
            disagree += we_differ != they_differ
    assert drops > 50 and disagree == 0
    assert caught / drops > 0.9, f"{caught}/{drops} dropped writes changed the final state"


def test_bfcls_full_checker_fails_what_our_state_check_fails(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    """BFCL's multi_turn_checker (state and results after every turn) on the same dropped writes.

    It checks after each turn, so it also fails drops whose effect a later turn undoes;
    every drop that our final-state comparison catches must fail it too.
    """
    category = "multi_turn_base"
    pack = packs[category]
    both = only_bfcl = only_ours = 0
    for task in pack.tasks[::4]:
        entry = bfcl_entries[category][task.id]
        gold_world = pack.replay(task)
        assert bfcl_checks(entry, category, entry.ground_truth)
        for kept in without_one_write(pack, task):
            we_fail = bool(run_ours(pack, task, kept).differences(gold_world))
            they_fail = not bfcl_checks(entry, category, turns_of(task, entry, kept))
            both += we_fail and they_fail
            only_bfcl += they_fail and not we_fail
            only_ours += we_fail and not they_fail
    assert only_ours == 0 and both > 50, (both, only_bfcl, only_ours)


def without_one_write(pack: Pack, task: EnvTask) -> Iterator[list[GoldCall]]:
    """The gold calls less one write call, for each write call of the gold."""
    for dropped in task.gold.calls:
        if pack.tool(dropped.name).writes:
            yield [c for c in task.gold.calls if c is not dropped]


def bfcl_checks(entry: Entry, category: str, turns: list[list[str]]) -> bool:
    """BFCL's verdict on a trajectory that made ``turns`` (each turn one step)."""
    test_entry = {
        "id": entry.id,
        "initial_config": entry.initial_config,
        "involved_classes": entry.involved_classes,
    }
    model = [[turn] for turn in turns]
    return bool(
        multi_turn_checker(model, entry.ground_truth, test_entry, category, new_model_name())["valid"]
    )


_checker_names: list[str] = []


def new_model_name() -> str:
    """A fresh model name for BFCL's checker (its executor caches instances in globals by name)."""
    name = f"toolfactory_{uuid.uuid4().hex}"
    _checker_names.append(name)
    return name


@pytest.fixture(autouse=True, scope="module")
def _forget_checker_instances() -> Iterator[None]:
    yield
    for key in [k for k in vars(multi_turn_utils) if k.startswith(tuple(_checker_names))]:
        del vars(multi_turn_utils)[key]


def test_read_only_tools_leave_the_compared_state_alone(packs: dict[str, Pack]) -> None:
    """Step through every gold call: a tool not marked ``writes`` never changes BFCL's compared state."""
    changed_by: set[str] = set()
    seen: set[str] = set()
    for pack in packs.values():
        for task in pack.tasks:
            world = pack.new_world(task)
            table = world[bfcl.TABLE]
            before = {n: comparable(table[n]) for n in table}
            for call in task.gold.calls:
                with contextlib.suppress(ToolError):
                    pack.call(world, call.name, call.arguments)
                after = {n: comparable(table[n]) for n in table}
                seen.add(call.name)
                if after != before:
                    changed_by.add(call.name)
                before = after
    read_only = {t.name for t in packs["multi_turn_base"].tools if not t.writes}
    assert changed_by & read_only == set()
    writes_seen = seen - read_only
    # every write the gold uses changes the compared state, but those that move what only
    # later calls read (cd's cursor, the vehicle's random stream): not safe to retry either
    assert writes_seen - changed_by <= {"cd", "get_current_speed", "get_outside_temperature_from_google"}
    assert len(writes_seen) > 30


# --------------------------------------------------------------------------- sessions and errors


def test_sessions_are_isolated_and_outputs_detached(packs: dict[str, Pack]) -> None:
    pack = packs["multi_turn_base"]
    task = pack.task("multi_turn_base_0")
    a, b = pack.new_world(task), pack.new_world(task)
    pack.call(a, "cd", {"folder": "document"})
    pack.call(a, "mkdir", {"dir_name": "temp"})
    listed = pack.call(b, "ls", {})
    pack.call(b, "cd", {"folder": "document"})
    assert "temp" not in pack.call(b, "ls", {})["current_directory_content"]
    assert "temp" in pack.call(a, "ls", {})["current_directory_content"]
    assert a.changed() == {(bfcl.TABLE, "GorillaFileSystem")} and b.changed() == set()
    assert a.digest() != b.digest() and a.differences(b) == [(bfcl.TABLE, "GorillaFileSystem")]
    assert isinstance(pack.base_state(task)[bfcl.TABLE]["GorillaFileSystem"], dict)  # the base stays JSON
    assert listed == {"current_directory_content": ["document", "archive"]}  # starts in workspace/

    tickets = next(t for t in pack.tasks if t.state_patch[bfcl.TABLE].get("TicketAPI", {}).get("config"))
    world = pack.new_world(tickets)
    live = world[bfcl.TABLE]["TicketAPI"].ticket_queue[0]
    shown = pack.call(world, "get_ticket", {"ticket_id": live["id"]})
    assert shown == live
    live["status"] = "changed by a later call"
    assert world.calls[-1].output == shown != live  # the logged output is not the live ticket


def test_sessions_never_share_a_default_argument(packs: dict[str, Pack]) -> None:
    """post_tweet's default ``mentions=[]`` is one list for the process: a session's mention
    must not show up in another session's tweet."""
    pack = packs["multi_turn_base"]
    task = next(t for t in pack.tasks if t.state_patch[bfcl.TABLE].get("TwitterAPI", {}).get("config"))
    login = task.state_patch[bfcl.TABLE]["TwitterAPI"]["config"]
    tweets = []
    for mention in (["@someone"], None):
        world = pack.new_world(task)
        pack.call(
            world, "authenticate_twitter", {"username": login["username"], "password": login["password"]}
        )
        tweet = pack.call(world, "post_tweet", {"content": "hello"})
        if mention:
            pack.call(world, "mention", {"tweet_id": tweet["id"], "mentioned_usernames": mention})
            assert pack.call(world, "get_tweet", {"tweet_id": tweet["id"]})["mentions"] == mention
        tweets.append(tweet)
    assert tweets[1]["mentions"] == []


def test_two_sessions_share_no_mutable_object(packs: dict[str, Pack]) -> None:
    """Long-context TravelAPI merges cards and bookings from module-level tables: by reference
    in BFCL, so one session's charge would show in every other's."""
    for pack in packs.values():
        for task in pack.tasks:
            for record in task.state_patch[bfcl.TABLE].values():
                assert (
                    not mutable_parts(load_instance(record)).keys()
                    & mutable_parts(load_instance(record)).keys()
                )


def test_sessions_leave_bfcls_module_data_and_defaults_alone(packs: dict[str, Pack]) -> None:
    """What every session shares (module tables, default arguments) is the same after all the gold."""

    def shared() -> Any:
        modules = {name: sys.modules[api_class(name).__module__] for name in OWNER.values()}
        tables = {
            (module.__name__, key): value
            for module in modules.values()
            for key, value in vars(module).items()
            if isinstance(value, dict | list | set) and not key.startswith("__")
        }
        # long-context get_outside_temperature_from_google writes its answer into this
        # module dict and returns the dict (we log a copy); nothing else reads it
        del tables[(modules["VehicleControlAPI"].__name__, "LONG_WEATHER_EXTENSION")]
        defaults = {
            (cls, name): function.__defaults__
            for cls in set(OWNER.values())
            for name, function in inspect.getmembers(api_class(cls), inspect.isfunction)
        }
        return copy.deepcopy((tables, defaults))

    before = shared()
    assert before[0]  # there are module tables to watch (long_context.py's, DEFAULT_STATEs)
    for pack in packs.values():
        for task in pack.tasks:
            pack.replay(task)
    assert shared() == before


def mutable_parts(value: Any, out: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every list, dict, set and object reachable from ``value``, by id."""
    out = {} if out is None else out
    if id(value) in out or isinstance(value, str | int | float | bool | type(None) | tuple):
        return out
    out[id(value)] = value
    if isinstance(value, dict):
        for item in value.values():
            mutable_parts(item, out)
    elif isinstance(value, list | set):
        for item in value:
            mutable_parts(item, out)
    elif hasattr(value, "__dict__"):
        for item in vars(value).values():
            mutable_parts(item, out)
    return out


def test_math_calls_leave_the_process_precision_alone(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    """logarithm sets mpmath's global precision, square_root the decimal context: for good,
    in BFCL; a served call must leave both as it found them (other tools use mpmath)."""
    pack = packs["multi_turn_base"]
    task = next(t for t in pack.tasks if "MathAPI" in t.metadata["involved_classes"])
    world = pack.new_world(task)
    mp_before, decimal_before = mpmath.mp.prec, decimal.getcontext().prec
    log = pack.call(world, "logarithm", {"value": 630.0, "base": 10, "precision": 5})
    root = pack.call(world, "square_root", {"number": 2, "precision": 3})
    assert (mpmath.mp.prec, decimal.getcontext().prec) == (mp_before, decimal_before)
    assert root == {"result": 1.41}
    theirs = run_bfcl(
        bfcl_entries["multi_turn_base"][task.id],
        "multi_turn_base",
        [["logarithm(value=630.0, base=10, precision=5)"]],
    )
    assert log == bfcl_value(theirs.results[0]) == {"result": 2.7993393}


def test_refusals_exceptions_and_bad_arguments_are_tool_errors(
    packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    pack = packs["multi_turn_base"]
    task = pack.task("multi_turn_base_0")  # GorillaFileSystem and TwitterAPI
    world = pack.new_world(task)
    with pytest.raises(ToolError) as refused:
        pack.call(world, "cd", {"folder": "nowhere"})
    assert refused.value.kind == ErrorKind.TOOL_ERROR and "nowhere" in refused.value.message
    assert world.calls[-1].error == refused.value.message
    theirs = run_bfcl(bfcl_entries["multi_turn_base"][task.id], "multi_turn_base", [["cd(folder='nowhere')"]])
    assert bfcl_failed(theirs.results[0]) and refused.value.message in theirs.results[0]
    with pytest.raises(ToolError) as wrong:
        pack.call(world, "cd", {"directory": "document"})
    assert wrong.value.kind == ErrorKind.INVALID_ARGUMENTS
    with pytest.raises(ToolError) as absent:
        pack.call(world, "get_flight_cost", {"travel_from": "SFO", "travel_to": "LAX", "travel_date": "x"})
    assert absent.value.kind == ErrorKind.UNKNOWN_TOOL and "TravelAPI" in absent.value.message

    travel = next(t for t in pack.tasks if "TravelAPI" in t.metadata["involved_classes"])
    world = pack.new_world(travel)
    with pytest.raises(ToolError) as raised:  # the method raises ValueError: BFCL's "Error during execution"
        pack.call(
            world,
            "get_flight_cost",
            {
                "travel_from": "XXX",
                "travel_to": "YYY",
                "travel_date": "2024-11-15",
                "travel_class": "economy",
            },
        )
    assert raised.value.kind == ErrorKind.TOOL_ERROR and "ValueError" in raised.value.message


def test_a_scenario_record_loads_like_bfcls_executor(bfcl_entries: dict[str, dict[str, Entry]]) -> None:
    entry = bfcl_entries["multi_turn_long_context"]["multi_turn_long_context_0"]
    theirs = run_bfcl(entry, "multi_turn_long_context", [[]]).instances
    for name in entry.involved_classes:
        record = {"class": name, "config": entry.initial_config.get(name, {}), "long_context": True}
        assert state_checker({name: load_instance(record)}, {name: theirs[name]})["valid"]
        assert record["config"] == entry.initial_config.get(name, {})  # loading never mutates the base


# --------------------------------------------------------------------------- the reward


def chat(task: EnvTask, world: World, dropped: GoldCall | None = None) -> VerifyRequest:
    """The conversation a multi-turn rollout records: each user turn, then its calls and results."""
    messages: list[dict[str, Any]] = list(task.prompt)
    records = iter(world.calls)
    for turn, ids in enumerate(task.metadata["turn_calls"]):
        if turn:
            messages.extend(task.metadata["turns"][turn - 1])
        for _ in [i for i in ids if dropped is None or i != dropped.id]:
            record = next(records)
            messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
            messages.append({"role": "tool", "name": record.name, "content": json.dumps(record.output)})
        messages.append({"role": "assistant", "content": "Done."})
    return VerifyRequest(
        verifier="tool_use",
        ground_truth={"pack": f"bfcl_{task.metadata['category']}", "task": task.id},
        messages=messages,
        response_start=len(task.prompt),
    )


@pytest.mark.parametrize("category", CATEGORIES)
def test_gold_replay_scores_one_and_a_missing_call_less(packs: dict[str, Pack], category: str) -> None:
    """Every task: the gold scores 1.0 (eval and train); without its last write, less."""
    pack = packs[category]
    train_short = {}
    for task in pack.tasks:
        gold = pack.replay(task)
        assert score(pack, task, gold, chat(task, gold), mode="eval").score == 1.0
        trained = score(pack, task, gold, chat(task, gold), mode="train")
        if trained.score != pytest.approx(1.0):
            train_short[task.id] = {k: v for k, v in trained.components.items() if k in WEIGHTED and v != 1.0}
        dropped = next(
            (c for c in reversed(task.gold.calls) if pack.tool(c.name).writes), task.gold.calls[-1]
        )
        world = run_ours(pack, task, [c for c in task.gold.calls if c is not dropped])
        result = score(pack, task, world, chat(task, world, dropped), mode="eval")
        assert result.score < 1.0 and result.components["calls"] == 0.0
        assert result.components["state"] == (0.0 if world.differences(gold) else 1.0)
    # entry 173's 'ticket_001' fits the widened ticket_id schema: no task falls short
    assert train_short == {}


# --------------------------------------------------------------------------- served


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # only the pack: BFCL's ``echo`` would clash with the test server's own echo tool
    config = server_config(
        tools=[],
        environments=[{"source": "tools.envs.bfcl:pack", "arguments": {"category": "multi_turn_base"}}],
    )
    with running_server(config) as srv:
        yield srv


def test_the_pack_served_plays_a_task_to_a_full_reward(server: ServerProcess, packs: dict[str, Pack]) -> None:
    pack = packs["multi_turn_base"]
    task = pack.task("multi_turn_base_0")
    session = f"s-{uuid.uuid4().hex}"
    environment = {"pack": pack.id, "task": task.id}
    opened = httpx.post(server.url + "/v1/sessions", json={"session": session, "environment": environment})
    assert opened.status_code == 201, opened.text

    def call(name: str, arguments: dict[str, Any]) -> Any:
        body = {
            "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
        }
        response = httpx.post(server.url + "/v1/calls", json=body, timeout=30)
        assert response.status_code == 200, response.text
        return decode_results(response.content)[0]

    travel = call("list_all_airports", {})  # TravelAPI: not a class this task involves
    assert travel.is_error and travel.error is not None and travel.error.kind.value == "unknown_tool"
    expected = pack.replay(task)
    for gold, record in zip(task.gold.calls, expected.calls, strict=True):
        result = call(gold.name, gold.arguments)
        assert not result.is_error, result.text
        assert result.structured == record.output or json.loads(result.text) == record.output
    assert verify(server, chat(task, expected), session)["score"] == 1.0

    short = f"s-{uuid.uuid4().hex}"  # a session that skips the last write (the diff)
    httpx.post(server.url + "/v1/sessions", json={"session": short, "environment": environment})
    session, dropped = short, next(c for c in reversed(task.gold.calls) if c.name == "mv")
    assert dropped.arguments == {"source": "previous_report.pdf", "destination": "temp"}
    for gold in task.gold.calls:
        if gold is not dropped:
            call(gold.name, gold.arguments)
    partial = verify(
        server,
        chat(task, run_ours(pack, task, [c for c in task.gold.calls if c is not dropped]), dropped),
        short,
    )
    assert partial["score"] == 0.0 and partial["components"]["state"] == 0.0


def verify(server: ServerProcess, request: VerifyRequest, session: str) -> dict[str, Any]:
    body = {"requests": [{**request.__dict__, "session": session, "arguments": {"mode": "eval"}}]}
    verified = httpx.post(server.url + "/v1/verify", json=body, timeout=60)
    assert verified.status_code == 200, verified.text
    return verified.json()["results"][0]
