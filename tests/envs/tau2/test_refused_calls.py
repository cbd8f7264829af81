"""Calls the server refuses on their schema get τ²'s verdict as τ² would have run them.

τ² checks no schema: a call with a status outside the enum, an argument of the wrong type, a
required argument missing or a null for an optional one runs in τ² (its tool stores the value,
or fails and counts toward τ²'s 10-error limit), while our server refuses it before it reaches
the world. The eval-mode reward on a τ² pack must still be τ²'s verdict: the server notes each
refused call in its place (``World.refused``) and the judge replays the run in τ²'s own
environment with them (``tools.envs.tau2.verdict.as_tau2_ran``).

A real server serves the mock pack; each trajectory plays through ``/v1/calls`` and is scored by
``/v1/verify`` (eval mode) and by τ²'s own ``evaluate_simulation`` on every call made
(``tests.envs.tau2.parity``). Covered: the issue's two cases, and a sweep of schema-invalid
calls (wrong enum, wrong type, missing argument, null) before, after, instead of and ten times
before the gold over every mock task.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.envs.tau2.parity import MAX_ERRORS, Call, Outcome, Trajectory, outcome
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import EnvTask, Pack
from tools.envs.tau2 import packs as tau2
from tools.envs.tau2.domain import load_domain

pytestmark = pytest.mark.timeout(900)
BAD_STATUS = Call("update_task_status", {"task_id": "task_2", "status": "zz_no_such_zz"})
# a valid call of each mock tool that takes arguments, to make invalid
BASES = {
    "create_task": {"user_id": "user_1", "title": "Important Meeting"},
    "update_task_status": {"task_id": "task_2", "status": "completed"},
    "transfer_to_human_agents": {"summary": "The user wants a human."},
}


@pytest.fixture(scope="module")
def pack() -> Pack:
    return tau2.pack("mock")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    environments = [{"source": "tools.envs.tau2:pack", "arguments": {"domain": "mock"}}]
    with running_server(server_config(environments=environments), startup_timeout_s=600) as srv:
        yield srv


def _said(task: EnvTask) -> list[str]:
    return [f"Done: {info}." for info in task.gold.communicate] or ["Is there anything else I can do?"]


def _gold(task: EnvTask) -> list[Call]:
    return [Call(c.name, copy.deepcopy(c.arguments)) for c in task.gold.calls]


def test_the_two_boundary_cases_get_tau2s_verdict(server: ServerProcess, pack: Pack) -> None:
    task = pack.task("update_task_with_message_history")  # gold: update_task_status(task_2, completed)
    gold = _gold(task)
    # τ² stores "zz_no_such_zz" ten times without an error, then the gold sets "completed": 1.0
    ten = outcome(
        server.url, pack, "mock", task, Trajectory("ten_bad", [BAD_STATUS] * MAX_ERRORS + gold, _said(task))
    )
    assert ten.refused == MAX_ERRORS
    assert (ten.tau2, ten.ours) == (1.0, 1.0), ten.reason
    assert ten.tau2_without_refused == 1.0
    # one bad write after the gold: τ²'s task ends "zz_no_such_zz", not the gold's "completed": 0.0
    after = outcome(server.url, pack, "mock", task, Trajectory("bad_after", [*gold, BAD_STATUS], _said(task)))
    assert after.refused == 1
    assert (after.tau2, after.ours) == (0.0, 0.0)
    assert "db" in after.reason and after.tau2_without_refused == 1.0  # the refused write decided it


def invalid_variants(
    arguments: dict[str, Any], schema: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Arguments that break ``schema`` (a tool's parameters): an enum value outside it (and one
    in the wrong case), a number for the first required string, null for an optional string,
    the first required argument missing."""
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    for key, spec in sorted(properties.items()):
        if "enum" in spec:
            yield "wrong_enum", {**arguments, key: "zz_no_such_zz"}
            yield "wrong_enum", {**arguments, key: str(arguments[key]).upper()}
        elif key not in required:
            yield "null", {**arguments, key: None}
    if required:
        yield "wrong_type", {**arguments, required[0]: 2}
        yield "missing_arg", {k: v for k, v in arguments.items() if k != required[0]}


def sweep(task: EnvTask) -> Iterator[Trajectory]:
    """Each schema-invalid call of each mock tool before, after, instead of, and ten times
    before the gold (instead: in place of a gold call of the same tool)."""
    schemas = load_domain("mock").schemas
    gold, said = _gold(task), _said(task)
    for name, base in BASES.items():
        for family, arguments in invalid_variants(base, schemas[name]["parameters"]):
            bad = Call(name, arguments)
            yield Trajectory(f"{family}:before", [bad, *gold], said)
            yield Trajectory(f"{family}:after", [*gold, bad], said)
            for index, call in enumerate(gold):
                if call.name == name:
                    yield Trajectory(f"{family}:instead", [*gold[:index], bad, *gold[index + 1 :]], said)
                    break
            if family in ("wrong_enum", "missing_arg"):  # τ² stores the one, and fails on the other
                yield Trajectory(f"{family}:ten_before", [*[bad] * MAX_ERRORS, *gold], said)


@pytest.fixture(scope="module")
def swept(server: ServerProcess, pack: Pack) -> list[Outcome]:
    return [
        outcome(server.url, pack, "mock", task, trajectory)
        for task in pack.tasks
        for trajectory in sweep(task)
    ]


def test_schema_invalid_calls_get_tau2s_verdict(swept: list[Outcome]) -> None:
    disagree = [(o.task, o.kind, o.tau2, o.ours, o.reason) for o in swept if not o.agree]
    # (τ²'s reward had the refused calls never been made, τ²'s reward): where they decided it
    flips = Counter((o.tau2_without_refused, o.tau2) for o in swept if o.tau2_without_refused != o.tau2)
    print(f"{len(swept)} trajectories, {len(disagree)} disagreements, decided by a refused call: {flips}")
    assert disagree == []
    # not vacuous: every call was refused by the server, every family and place is there, and the
    # refused calls decide τ²'s verdict both ways (what the server did not run would say otherwise)
    assert all(o.refused >= 1 for o in swept)
    assert {o.kind.split(":")[0] for o in swept} == {"wrong_enum", "wrong_type", "missing_arg", "null"}
    assert {o.kind.split(":")[1] for o in swept} == {"before", "after", "instead", "ten_before"}
    assert flips[1.0, 0.0] >= 5 and flips[0.0, 1.0] >= 2, flips
