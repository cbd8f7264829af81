"""The default ``tool_use`` train weights pay no shortcut (docs/environments.md, "The reward").

A GRPO group turns any reward difference into a full-size advantage, so under the default
weights, on procedural tasks of levels 1-3 (one call, two parallel calls, a chain):

- a bare guess (no call, the lucky right reply) scores below the right first call alone;
- repeating the first call scores below making it once;
- a failed call with the same lucky reply scores at least the bare guess (trying never loses to guessing),
  at most 0.5 and below the right first call;
- the guess, the repeat, the failed call and the half-done trajectory all score below the correct one.

tests/verifiers/test_reward_hacking.py runs every cheating family over every world.

Worlds, call logs and gold replays are real: calls run through ``Pack.call`` on a fresh
``Pack.new_world``, as on the server.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from protocol import ToolError, VerifyRequest
from tools.envs.pack import EnvTask, Pack, call_depths
from tools.envs.procedural import WORLDS, pack
from tools.envs.world import World
from tools.verifiers.tool_use.reward import DEFAULT_WEIGHTS, score

Call = tuple[str, dict[str, Any]]


@pytest.fixture(scope="module", params=WORLDS)
def world_pack(request: pytest.FixtureRequest) -> Pack:
    return pack(world=request.param, seed=0, tasks=24, levels=[1, 2, 3])


def _gold(task: EnvTask) -> list[Call]:
    depths = call_depths(task.gold.calls)
    return [(c.name, dict(c.arguments)) for c in sorted(task.gold.calls, key=lambda c: depths[c.id])]


def _reply(task: EnvTask) -> str:
    """The right final reply: what a lucky guess would say."""
    said = " ".join(["Done.", *task.gold.communicate])
    return said if task.gold.answer is None else f"{said} <answer>{task.gold.answer}</answer>"


def _score(p: Pack, task: EnvTask, calls: list[Call], reply: str | None) -> float:
    """Train score of a trajectory making ``calls`` (one per turn), then ``reply`` (None: it stops)."""
    world: World = p.new_world(task)
    messages: list[dict[str, Any]] = [*task.prompt]
    for name, arguments in calls:
        with contextlib.suppress(ToolError):
            p.call(world, name, arguments)
        record = world.calls[-1]
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        messages.append({"role": "tool", "name": name, "content": str(record.output or record.error)})
    if reply is not None:
        messages.append({"role": "assistant", "content": reply})
    request = VerifyRequest(
        verifier="tool_use",
        ground_truth={"pack": p.id, "task": task.id},
        messages=messages,
        response_start=len(task.prompt),
    )
    return score(p, task, world, request, mode="train").score


def _wrong(call: Call) -> Call:
    """The call with every string argument replaced by an id no world has."""
    name, arguments = call
    return name, {k: ("Z-9999" if isinstance(v, str) else v) for k, v in arguments.items()}


@pytest.mark.parametrize("level", [1, 2, 3])
def test_no_shortcut_pays_as_much_as_the_right_calls(world_pack: Pack, level: int) -> None:
    tasks = [t for t in world_pack.tasks if t.complexity.level == level]
    assert tasks, f"no level {level} task in {world_pack.id}"
    for task in tasks:
        gold, reply = _gold(task), _reply(task)
        correct = _score(world_pack, task, gold, reply)
        guess = _score(world_pack, task, [], reply)
        first_only = _score(world_pack, task, gold[:1], None)
        repeated = _score(world_pack, task, gold[:1] * 2, None)
        failed_then_guess = _score(world_pack, task, [_wrong(gold[0])], reply)
        figures = dict(
            correct=correct, guess=guess, first_only=first_only, repeated=repeated, failed=failed_then_guess
        )
        assert correct == 1.0, (task.id, figures)
        assert guess < first_only, (task.id, "a bare guess pays as much as the right first call", figures)
        assert repeated < first_only, (task.id, "repeating the first call pays", figures)
        assert guess <= failed_then_guess, (task.id, "a guess beats trying a call", figures)
        # the junk-argument call with the lucky reply fails the task: at most half, below the right calls
        assert failed_then_guess <= 0.5 and failed_then_guess < first_only, (task.id, figures)
        assert max(guess, repeated, failed_then_guess, first_only if len(gold) > 1 else 0.0) < correct, (
            task.id,
            figures,
        )


def test_the_default_weights_sum_to_one_with_per_call_credit() -> None:
    assert sum(w for w in DEFAULT_WEIGHTS.values() if w > 0) == pytest.approx(1.0)
    # per-call credit: each solved gold call pays (completeness S/G), not only a finished task
    assert DEFAULT_WEIGHTS.get("completeness", 0) > DEFAULT_WEIGHTS.get("answer", 0)
    assert DEFAULT_WEIGHTS["penalty"] < 0
