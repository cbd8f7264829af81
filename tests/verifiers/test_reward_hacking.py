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
from dataclasses import replace
from typing import Any

import httpx
import pytest

from protocol import decode_results, decode_verify_results
from tests.support.reward_hacks import FINISHING, Trajectory, cheats, check_task, ladder, messages, scored
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs import image_env
from tools.envs.pack import EnvTask, Pack
from tools.envs.procedural import WORLDS, pack

TASKS = 24  # per pack: 6 per level


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


@pytest.mark.parametrize("name", sorted(PACKS))
def test_no_cheat_pays_and_the_honest_ladder_rises(name: str) -> None:
    p = PACKS[name]
    levels = {t.complexity.level for t in p.tasks}
    assert levels == ({1, 2, 3} if name == "image" else {1, 2, 3, 4}), levels
    worst: dict[str, float] = {}
    for task in p.tasks:
        for family, value in check_task(p, task).items():
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
    result = scored(p, task, junk)
    assert result.components["completeness"] == 0.0 and result.components["failed_calls"] == 2.0
    assert result.score < 0.2, result.components
    assert "does not hold what the task needs" in result.details["unmatched"][0]["why"]


# --------------------------------------------------------------------------- through the server

SERVED = {world: PACKS[world] for world in WORLDS} | {
    "image": PACKS["image"],
    "bank-typed": PACKS["bank-typed"],
}
PREFIX = {"bank-typed": "t_"}  # served beside the bank world: its tool names behind a prefix


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
            "source": "tools.envs.procedural:pack",
            "arguments": {
                "world": "bank",
                "seed": 1,
                "tasks": TASKS,
                "levels": [1, 2, 3, 4],
                "parameter_type_generalisation": 1.0,
            },
            "toolset": "bank-typed",
            "prefix": PREFIX["bank-typed"],
        },
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
        },
    ]
    with running_server(server_config(environments=environments)) as srv:
        yield srv


def _served_scores(
    srv: ServerProcess, p: Pack, task: EnvTask, trajectories: list[Trajectory], prefix: str = ""
) -> list[Any]:
    """Each trajectory played in its own session bound to ``task`` (all calls in one batch: a
    session's calls run in order) and scored by ``/v1/verify`` on its world (one batch); tool
    names behind ``prefix`` on the server."""
    trajectories = [replace(t, calls=[(prefix + n, a) for n, a in t.calls]) for t in trajectories]
    sessions = [uuid.uuid4().hex for _ in trajectories]
    for session in sessions:
        opened = httpx.post(
            srv.url + "/v1/sessions",
            json={"session": session, "environment": {"pack": p.id, "task": task.id}},
            timeout=60,
        )
        assert opened.status_code == 201, srv.output[-3000:]
    try:
        calls = [
            {"call_id": uuid.uuid4().hex, "name": n, "arguments": a, "session": session}
            for session, trajectory in zip(sessions, trajectories, strict=True)
            for n, a in trajectory.calls
        ]
        response = httpx.post(srv.url + "/v1/calls", json={"calls": calls}, timeout=120)
        assert response.status_code == 200, srv.output[-3000:]
        results = iter(decode_results(response.content))
        refused = {"invalid_arguments", "unknown_tool"}
        requests = []
        for session, trajectory in zip(sessions, trajectories, strict=True):
            mine = [next(results) for _ in trajectory.calls]
            shown = [None if r.is_error and r.error and r.error.kind in refused else _Shown(r) for r in mine]
            requests.append(
                {
                    "verifier": "tool_use",
                    "ground_truth": {"pack": p.id, "task": task.id},
                    "messages": messages(task, trajectory, shown),
                    "response_start": len(task.prompt),
                    "session": session,
                }
            )
        verdicts = httpx.post(srv.url + "/v1/verify", json={"requests": requests}, timeout=120)
        assert verdicts.status_code == 200, srv.output[-3000:]
        return decode_verify_results(verdicts.content)
    finally:
        for session in sessions:
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
        trajectories = [*ladder(task), *cheats(task)]
        for trajectory, served in zip(
            trajectories, _served_scores(server, p, task, trajectories, PREFIX.get(name, "")), strict=True
        ):
            local = scored(p, task, trajectory)
            assert served.score == pytest.approx(local.score, abs=1e-9), (task.id, trajectory.family)
            if not trajectory.family.startswith("honest") and trajectory.family not in FINISHING:
                assert served.score <= 0.5 and served.components["success"] == 0.0, (
                    task.id,
                    trajectory.family,
                )
