"""Environment packs for the workbench: tasks by level, gold calls, and a replay of the gold.

``replay_gold`` plays a task's gold calls in a fresh world (``Pack.replay``), then scores
that world with the environments' own reward (``tool_use``, eval mode) as if an agent had
made exactly those calls and given the gold answer: what a perfect trajectory earns.
"""

from __future__ import annotations

from typing import Any

import orjson

from protocol import VerifyRequest
from tools.envs.host import EnvHost
from tools.envs.pack import EnvTask
from tools.envs.world import jsonable

__all__ = ["describe_packs", "replay_gold"]

MAX_TASKS = 5000  # per pack in the listing


def _plain(value: Any) -> Any:
    """JSON-able data for a world record (pydantic models, objects)."""
    return orjson.loads(orjson.dumps(value, default=jsonable))


def _task(task: EnvTask) -> dict[str, Any]:
    prompt = next((m.get("content") for m in reversed(task.prompt) if m.get("role") == "user"), None)
    return {
        "id": task.id,
        "level": task.complexity.level,
        "scenario": task.complexity.scenario,
        "prompt": prompt if isinstance(prompt, str) else _plain(prompt),
        "gold": [
            {"id": c.id, "name": c.name, "arguments": _plain(c.arguments), "depends_on": list(c.depends_on)}
            for c in task.gold.calls
        ],
        "answer": task.gold.answer,
        "reward_basis": list(task.reward_basis),
    }


def describe_packs(host: EnvHost | None) -> list[dict[str, Any]]:
    if host is None:
        return []
    packs = []
    for pack_id, pack in sorted(host.packs.items()):
        packs.append(
            {
                "id": pack_id,
                "origin": pack.info.origin,
                "domain": pack.info.domain,
                "description": pack.info.description,
                "prefix": host.prefixes.get(pack_id, ""),
                "tools": [t.name for t in pack.tools],
                "tasks": [_task(t) for t in pack.tasks[:MAX_TASKS]],
                "task_count": len(pack.tasks),
            }
        )
    return packs


def replay_gold(host: EnvHost, pack_id: str, task_id: str) -> dict[str, Any]:
    """The gold calls' outputs, the records they changed (before/after), and the reward."""
    pack, task = host.resolve(pack_id, task_id)  # LookupError names what is unknown
    world = pack.replay(task)
    changes = []
    for table, key in sorted(world.changed()):
        before = world[table].base_record(key, None)
        after = world[table].peek(key, None)
        changes.append({"table": table, "key": key, "before": _plain(before), "after": _plain(after)})
    calls = [
        {"name": c.name, "arguments": _plain(c.arguments), "output": _plain(c.output), "error": c.error}
        for c in world.calls
    ]
    from tools.verifiers.tool_use.reward import score  # the reward (as the server loads it: on first use)

    answer = " ".join(filter(None, [task.gold.answer, *task.gold.communicate]))
    messages: list[dict[str, Any]] = []
    for call in world.calls:
        messages.append({"role": "assistant", "content": ""})
        messages.append({"role": "tool", "name": call.name, "content": ""})
    messages.append({"role": "assistant", "content": answer})
    request = VerifyRequest(
        verifier="tool_use",
        ground_truth={"pack": pack_id, "task": task_id},
        response=answer,
        messages=messages,
    )
    result = score(pack, task, world, request, mode="eval")
    return {
        "pack": pack_id,
        "task": task_id,
        "calls": calls,
        "changes": changes,
        "reward": {"score": result.score, "components": result.components, "details": _plain(result.details)},
    }
