"""Rewards that cannot be gamed: every cheating family against the honest ladder, in every world.

Under the default ``tool_use`` train weights (docs/environments.md, "Reward hacking"):

- no trajectory that fails the task earns more than 0.5 (``success`` is half the reward);
- every cheating family (tests/support/reward_hacks.py: junk arguments, empty-result lookups,
  number spam, repeats with varied arguments, the right tools in the wrong order, the prompt
  copied back, "Done." alone, long babble, an answer without the calls, the calls after the
  answer) scores strictly below the honest trajectory that made one more gold call than it did;
- the honest ladder rises: k of G gold calls < k + 1 of G <= all of them with the right reply = 1.0.

Over the four procedural worlds at levels 1-4, their typed and functional variants and the image
environment, in process (worlds and gold replays are real, calls run through ``Pack.call`` and
the schema check the server applies); a sample of each world also through a real server's
``/v1/calls`` and ``/v1/verify`` (the same scores). Built packs: tests/envs/test_builder.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from protocol import decode_results, decode_verify_results
from tests.support.reward_hacks import Trajectory, cheats, ladder, messages, play_in_process
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs import image_env
from tools.envs.pack import EnvTask, Pack
from tools.envs.procedural import WORLDS, pack
from tools.verifiers.tool_use.reward import score

TASKS = 24  # per pack: 6 per level
# Families whose trajectory holds a call that does a one-call task (the repeats come after it).
FINISHING = {"varied_repeats"}


def _packs() -> dict[str, Pack]:
    out: dict[str, Pack] = {}
    for world in WORLDS:
        out[world] = pack(world, seed=0, tasks=TASKS, levels=[1, 2, 3, 4])
        out[f"{world}-typed"] = pack(
            world, seed=1, tasks=TASKS, levels=[1, 2, 3, 4], parameter_type_generalisation=1.0
        )
        out[f"{world}-functional"] = pack(
            world, seed=2, tasks=TASKS, levels=[1, 2, 3, 4], functional_generalisation=1.0
        )
    out["image"] = image_env.pack(seed=0, tasks=9, levels=(1, 2, 3), width=800, height=600, labels=3)
    return out


PACKS = _packs()


def _scored(p: Pack, task: EnvTask, trajectory: Trajectory) -> Any:
    world, request = play_in_process(p, task, trajectory)
    return score(p, task, world, request, mode="train")


def _check_task(p: Pack, task: EnvTask) -> dict[str, float]:
    """Score the ladder and every cheat of ``task``; assert the bound and the ranking. Returns
    each family's score (for the summary test)."""
    rungs = [_scored(p, task, t) for t in ladder(task)]
    figures = {t.family: r.score for t, r in zip(ladder(task), rungs, strict=True)}
    assert rungs[-1].score == 1.0, (task.id, "the correct trajectory", rungs[-1].details)
    for lower, higher in zip(rungs[:-2], rungs[1:-1], strict=True):
        assert lower.score < higher.score, (
            task.id,
            "an honest rung pays no more than the one below",
            figures,
        )
    if len(rungs) > 1:
        assert rungs[-2].score <= rungs[-1].score, (task.id, figures)
    gold_count = len(task.gold.calls)
    out = {}
    for cheat in cheats(task):
        result = _scored(p, task, cheat)
        out[cheat.family] = result.score
        why = (task.id, cheat.family, result.score, figures, result.components)
        solved = round(result.components["completeness"] * gold_count)
        assert result.score < rungs[min(solved, len(rungs) - 1)].score, why
        if result.components["success"] == 1.0:
            # only repeats may ride on a call that already did the task: they earn nothing past it
            assert cheat.family in FINISHING, why
            assert result.score < rungs[solved - 1].score, why
        else:
            assert result.score <= 0.5, why
    return out


@pytest.mark.parametrize("name", sorted(PACKS))
def test_no_cheat_pays_and_the_honest_ladder_rises(name: str) -> None:
    p = PACKS[name]
    levels = {t.complexity.level for t in p.tasks}
    assert levels == ({1, 2, 3} if name == "image" else {1, 2, 3, 4}), levels
    worst: dict[str, float] = {}
    for task in p.tasks:
        for family, value in _check_task(p, task).items():
            worst[family] = max(worst.get(family, 0.0), value)
    # every family ran somewhere in this pack
    expected = {
        "junk_arguments",
        "number_spam",
        "varied_repeats",
        "done_alone",
        "long_babble",
        "answer_without_calls",
    }
    assert expected <= set(worst), sorted(worst)


def test_the_measured_junk_lookup_shortcut_is_closed() -> None:
    """The case the issue measured: two junk lookups and a wrong answer on a lookup-only
    calendar task used to score 0.75-0.85 against 1.0; now they find nothing and fail."""
    p = PACKS["calendar"]
    task = next(
        t for t in p.tasks if t.gold.answer is not None and all(c.name == "find_room" for c in t.gold.calls)
    )
    junk = Trajectory(
        "junk", [("find_room", {"name": "qq0"}), ("find_room", {"name": "qq1"})], "I do not know"
    )
    result = _scored(p, task, junk)
    assert result.components["completeness"] == 0.0 and result.components["failed_calls"] == 2.0
    assert result.score < 0.2, result.components
    assert "does not hold what the task needs" in result.details["unmatched"][0]["why"]


# --------------------------------------------------------------------------- through the server

SERVED = {world: PACKS[world] for world in WORLDS} | {"image": PACKS["image"]}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    environments = [
        {
            "source": "tools.envs.procedural:pack",
            "arguments": {"world": w, "seed": 0, "tasks": TASKS, "levels": [1, 2, 3, 4]},
        }
        for w in WORLDS
    ] + [
        {
            "source": "tools.envs.image_env:pack",
            "arguments": {
                "seed": 0,
                "tasks": 9,
                "levels": [1, 2, 3],
                "width": 800,
                "height": 600,
                "labels": 3,
            },
        }
    ]
    with running_server(server_config(environments=environments)) as srv:
        yield srv


def _served_score(srv: ServerProcess, p: Pack, task: EnvTask, trajectory: Trajectory) -> Any:
    session = uuid.uuid4().hex
    opened = httpx.post(
        srv.url + "/v1/sessions",
        json={"session": session, "environment": {"pack": p.id, "task": task.id}},
        timeout=60,
    )
    assert opened.status_code == 201, srv.output[-3000:]
    try:
        body = {
            "calls": [
                {"call_id": uuid.uuid4().hex, "name": n, "arguments": a, "session": session}
                for n, a in trajectory.calls
            ]
        }
        results = []
        if trajectory.calls:
            response = httpx.post(srv.url + "/v1/calls", json=body, timeout=60)
            assert response.status_code == 200, srv.output[-3000:]
            results = decode_results(response.content)
        refused = {"invalid_arguments", "unknown_tool"}
        records = [None if r.is_error and r.error and r.error.kind in refused else r for r in results]
        chat = messages(task, trajectory, [_Shown(r) if r is not None else None for r in records])
        request = {
            "verifier": "tool_use",
            "ground_truth": {"pack": p.id, "task": task.id},
            "messages": chat,
            "response_start": len(task.prompt),
            "session": session,
        }
        verdict = httpx.post(srv.url + "/v1/verify", json={"requests": [request]}, timeout=60)
        assert verdict.status_code == 200, srv.output[-3000:]
        return decode_verify_results(verdict.content)[0]
    finally:
        httpx.delete(f"{srv.url}/v1/sessions/{session}", timeout=60)


class _Shown:
    """A served result as ``messages`` shows it in a tool message."""

    def __init__(self, result: Any) -> None:
        self.output = result.content
        self.error = result.error.message if result.error else None


@pytest.mark.parametrize("name", sorted(SERVED))
def test_the_server_scores_cheats_as_in_process(server: ServerProcess, name: str) -> None:
    p = SERVED[name]
    for level in sorted({t.complexity.level for t in p.tasks}):
        task = next(t for t in p.tasks if t.complexity.level == level)
        for trajectory in [*ladder(task), *cheats(task)]:
            served = _served_score(server, p, task, trajectory)
            assert not served.is_error, served.error
            local = _scored(p, task, trajectory)
            assert served.score == pytest.approx(local.score, abs=1e-9), (task.id, trajectory.family)
            if not trajectory.family.startswith("honest") and trajectory.family not in FINISHING:
                assert served.score <= 0.5 and served.components["success"] == 0.0, (
                    task.id,
                    trajectory.family,
                )
