"""The eval-mode reward of a BFCL task is BFCL's own verdict, on imperfect trajectories too.

A real server serves the four BFCL multi-turn packs. Each task's gold is perturbed into
trajectories of many kinds (a call dropped, repeated, taken from another turn, two swapped,
one moved to the next or the previous turn, an argument changed in value, case or format,
an integer sent as a float, a default spelled out or left out, a list reversed, an unknown
tool called, a turn left empty, the conversation stopped early); each plays in a session
through ``/v1/calls`` and is scored by ``/v1/verify`` (``tool_use``, eval mode), and by BFCL's
own evaluation (its ``multi_turn_checker``, run here on our own perturbed gold). They must
agree on every one, pass or fail and reward. ``bench/environments/reward_parity_bfcl.py`` runs every task.

Every task's gold also plays through the server, schemas enforced, and passes; a call the
schema refuses is judged as one that changed nothing (the one named difference); and BFCL's
leaderboard numbers computed from served verdicts equal those of BFCL's own checker.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.support.require import require

require("bfcl_eval", reason="bfcl-eval is installed by `make setup` (pip install --no-deps)")

from tests.envs.bfcl.parity import (  # noqa: E402
    UNKNOWN_TOOL,
    Call,
    Outcome,
    Served,
    Trajectory,
    bfcl_verdict,
    gold_turns,
    perturbations,
    schema_refused,
    served,
)
from tests.support.server import ServerProcess, running_server, server_config  # noqa: E402
from tools.envs.bfcl import packs as bfcl  # noqa: E402
from tools.envs.bfcl.data import CATEGORIES, Entry, entries  # noqa: E402
from tools.envs.bfcl.leaderboard import leaderboard  # noqa: E402
from tools.envs.pack import EnvTask, Pack  # noqa: E402

pytestmark = pytest.mark.timeout(900)
# BFCL's tool names are the same in every category: all but one served under a prefix
PREFIXES = {
    "multi_turn_base": "",
    "multi_turn_miss_func": "mf_",
    "multi_turn_miss_param": "mp_",
    "multi_turn_long_context": "lc_",
}
SAMPLE = 20  # every 20th task of a category: 10 of its 200 (the bench runs all)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    environments = [
        {"source": "tools.envs.bfcl:pack", "arguments": {"category": category}, "prefix": prefix}
        for category, prefix in PREFIXES.items()
    ]
    with running_server(server_config(tools=[], environments=environments)) as srv:
        yield srv


@pytest.fixture(scope="module")
def player(server: ServerProcess) -> Iterator[Served]:
    with served(server.url, {f"bfcl_{c}": p for c, p in PREFIXES.items()}) as p:
        yield p


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {category: bfcl.pack(category) for category in CATEGORIES}


@pytest.fixture(scope="module")
def bfcl_entries() -> dict[str, dict[str, Entry]]:
    return {category: {e.id: e for e in entries(category)} for category in CATEGORIES}


@pytest.mark.parametrize("category", CATEGORIES)
def test_served_eval_reward_is_bfcls_verdict(
    player: Served, packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]], category: str
) -> None:
    pack = packs[category]
    rng = random.Random(category)
    outcomes: list[Outcome] = []
    for task in pack.tasks[::SAMPLE]:
        entry = bfcl_entries[category][task.id]
        for trajectory in perturbations(pack, task, rng):
            valid, error = bfcl_verdict(entry, category, trajectory)
            result = player.verdict(pack, task, trajectory)
            outcomes.append(
                Outcome(
                    category,
                    task.id,
                    trajectory.kind,
                    valid,
                    error,
                    result["score"],
                    result["components"],
                    str(result["details"].get("benchmark")),
                )
            )
    disagreements = [(o.task, o.kind, o.bfcl_error, o.ours, o.reason) for o in outcomes if not o.agrees]
    assert disagreements == []
    kinds = Counter(o.kind for o in outcomes)
    assert len(kinds) >= 14 and len(outcomes) >= 120, kinds
    # not a trivial agreement: BFCL passes some non-gold trajectories and fails others
    passed = Counter(o.kind for o in outcomes if o.bfcl)
    assert passed["gold"] == kinds["gold"] == 200 // SAMPLE
    assert 0 < sum(passed.values()) - passed["gold"] < len(outcomes) - kinds["gold"]
    # BFCL's own rules show: a call repeated or an unknown tool called still passes (results
    # are an unordered sub-multiset, state is checked per turn); a call moved to the next turn fails
    assert passed["unknown_tool"] == kinds["unknown_tool"]
    assert passed["moved_to_next_turn"] == 0
    # the finer components stay alongside the verdict
    assert all(
        {"benchmark_state", "benchmark_response", "benchmark_turns", "f1"} <= set(o.components)
        for o in outcomes
    )


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_gold_plays_through_the_server_and_passes(
    player: Served, packs: dict[str, Pack], category: str
) -> None:
    """Schemas enforced: entry 173's close_ticket('ticket_001') runs (ticket_id is widened to
    what BFCL accepts), and every task's gold earns BFCL's pass through /v1/calls and /v1/verify."""
    pack = packs[category]
    failed = {}
    for task in pack.tasks:
        result = player.verdict(pack, task, Trajectory("gold", gold_turns(task)))
        if result["score"] != 1.0 or result["details"]["refused"]:
            failed[task.id] = (
                result["score"],
                result["details"]["refused"],
                result["details"].get("benchmark"),
            )
    assert failed == {}


def test_a_call_the_schema_refuses_is_judged_as_one_that_changed_nothing(
    player: Served, packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    """The one named difference: an integer sent as a string of digits. BFCL checks no type and
    runs the call; our server refuses it before it runs. The verdict is BFCL's on the
    trajectory as it ran: that call replaced by one that fails and changes nothing (it still
    makes its turn non-empty, as BFCL's decoder would)."""
    category = "multi_turn_base"
    pack = packs[category]
    rng = random.Random(3)
    outcomes = Counter()
    for task in pack.tasks[::SAMPLE]:
        trajectory = schema_refused(task, rng)
        if trajectory is None:
            continue
        result = player.verdict(pack, task, trajectory)
        assert len(result["details"]["refused"]) == 1, result["details"]
        as_ran = Trajectory(
            "as_ran",
            [
                [c if c is not trajectory.changed else Call(UNKNOWN_TOOL, {}) for c in turn]
                for turn in trajectory.turns
            ],
        )
        valid, _ = bfcl_verdict(bfcl_entries[category][task.id], category, as_ran)
        assert result["score"] == (1.0 if valid else 0.0), (
            task.id,
            trajectory.note,
            result["details"]["benchmark"],
        )
        outcomes[bfcl_verdict(bfcl_entries[category][task.id], category, trajectory)[0] == valid] += 1
    assert sum(outcomes.values()) >= 5, outcomes


def imperfect(task: EnvTask, number: int) -> Trajectory:
    """A scripted policy's trajectory: the gold, but every second task makes one mistake
    (by turns: a call made a turn late, a string argument upper-cased, a turn's calls reversed)."""
    turns = gold_turns(task)
    spots = [(t, i) for t, turn in enumerate(turns) for i, c in enumerate(turn)]
    mistake = number % 6
    if mistake == 1 and len(turns) > 1 and turns[0]:
        turns[1].insert(0, turns[0].pop())
    elif mistake == 3:
        for t, i in spots:
            strings = [k for k, v in turns[t][i].arguments.items() if isinstance(v, str) and v.upper() != v]
            if strings:
                turns[t][i].arguments[strings[0]] = turns[t][i].arguments[strings[0]].upper()
                break
    elif mistake == 5:
        turns = [list(reversed(turn)) for turn in turns]
    return Trajectory(f"policy_{mistake}", turns)


def test_the_leaderboard_report_gives_bfcls_accuracy(
    player: Served, packs: dict[str, Pack], bfcl_entries: dict[str, dict[str, Entry]]
) -> None:
    """Gold scores 100 % per category; a scripted imperfect policy scores what BFCL's own
    checker says of the same trajectories, category by category and overall."""
    gold_rows, policy_rows, expected_rows = [], [], []
    for category, pack in packs.items():
        for number, task in enumerate(pack.tasks[:: SAMPLE * 2]):
            gold_rows.append(
                (pack.id, task.id, player.verdict(pack, task, Trajectory("gold", gold_turns(task)))["score"])
            )
            trajectory = imperfect(task, number)
            policy_rows.append((pack.id, task.id, player.verdict(pack, task, trajectory)["score"]))
            valid, _ = bfcl_verdict(bfcl_entries[category][task.id], category, trajectory)
            expected_rows.append((category, task.id, 1.0 if valid else 0.0))
    gold = leaderboard(gold_rows)
    assert [s.accuracy for s in gold.categories.values()] == [1.0] * 4 and gold.overall == 1.0
    assert gold.table().splitlines()[1].split(" | ")[0].strip() == "100.00%"
    ours, expected = leaderboard(policy_rows), leaderboard(expected_rows)
    assert ours == expected and ours.table() == expected.table()
    assert 0.4 < ours.overall < 1.0, ours.table()  # the policy's mistakes cost it, not all of them
