"""Environment pack tasks as veRL-format rows: one row per task, scored by the ``tool_use`` verifier.

A row's prompt is the pack's policy (as system text) followed by the task's prompt; its
ground truth is ``{"pack", "task"}`` (the server looks the gold up: gold never travels
to the trainer); ``extra_info`` names the pack, the task, its complexity level, the
verifier and the MCP descriptors of the tools the task exposes, which the trainer gives
the chat template and the parser. The rollout binds each trajectory's session to the
task, so its world starts from the task's state.

Users: a task with a ``user_scenario`` (τ²) is played ``solo`` by default, its prompt
handing the agent the scenario as a ticket. Built for a ``simulated`` user, its prompt is
``metadata["user_sim_prompt"]`` (τ²: the customer's short opening; else the task's own
prompt) and ``extra_info["user_sim"]`` carries the scenario for the rollout's simulator
(``trainer_client.rollout.user_sim``): the scenario, never the gold. A task whose user acts
through tools of its own (``metadata["user_tools"]``, τ²'s dual control) is built only for a
simulated user: ``user_sim["tools"]`` holds those tools' descriptors, and ``tools`` (the
agent's) leaves them out.

Tools added mid-conversation (BFCL miss_func, ``metadata["tools_added"]``: later turn ->
tool names): ``extra_info["tools"]`` lists only the tools available from the start and
``extra_info["new_tools"][i]`` those the later turn ``turns[i]`` makes available; the
rollout core announces them with that turn and refuses calls to them before it.

Splits: a task whose ``metadata["split"]`` is ``train`` or ``test`` keeps it (an
importer's official split); the others are shuffled with the seed and the first
``test_fraction`` of them go to ``test``.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Any

from tools.envs.host import USER_TOOLS
from tools.envs.pack import EnvTask, Pack

__all__ = ["ABILITY", "USERS", "VERIFIER", "build_rows", "task_row"]

ABILITY = "tool_use"
VERIFIER = "tool_use"
SPLITS = ("train", "test")
USERS = ("solo", "simulated")  # who plays the user of a task with a user scenario


def task_row(
    pack: Pack, task: EnvTask, *, split: str, index: int, prefix: str = "", user: str = "solo"
) -> dict[str, Any]:
    """One veRL row for ``task`` (tool names with ``prefix``, as the server serves them;
    ``user`` one of ``USERS``: ``simulated`` applies to a task with a user scenario)."""
    if user not in USERS:
        raise ValueError(f"user must be one of {', '.join(USERS)}, got {user!r}")
    simulated = user == "simulated" and bool(task.user_scenario)
    user_tools = set(task.metadata.get(USER_TOOLS) or ())  # the simulated user's own (τ² dual control)
    if user_tools and not simulated:
        raise ValueError(
            f"task {task.id!r}: its user acts through tools of its own (τ² dual control); "
            "build it with a simulated user (--env-user simulated)"
        )
    prompt = (task.metadata.get("user_sim_prompt") or task.prompt) if simulated else task.prompt
    exposed = set(task.tools) if task.tools is not None else None
    descriptors = {
        tool.name: {**tool.descriptor(), "name": prefix + tool.name}
        for tool in pack.tools
        if (exposed is None or tool.name in exposed) and tool.name not in user_tools
    }
    user_sim: dict[str, Any] = {"scenario": task.user_scenario}
    if user_tools:
        user_sim["tools"] = [
            {**tool.descriptor(), "name": prefix + tool.name}
            for tool in pack.tools
            if tool.name in user_tools
        ]
    turns = task.metadata.get("turns") or []
    added = task.metadata.get("tools_added") or {}
    unknown = sorted({n for names in added.values() for n in names} - set(descriptors))
    if unknown:
        raise ValueError(f"task {task.id!r} adds tools it does not expose: {unknown}")
    # turn 0 is the prompt: what it "adds" is available from the start
    new_tools = [[descriptors[n] for n in added.get(str(i + 1), ())] for i in range(len(turns))]
    later = {d["name"] for turn in new_tools for d in turn}
    tools = [d for d in descriptors.values() if d["name"] not in later]
    return {
        "data_source": f"env/{pack.id}",
        "prompt": _prompt(pack.policy, prompt),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"pack": pack.id, "task": task.id}},
        "extra_info": {
            "split": split,
            "index": index,
            "pack": pack.id,
            "task": task.id,
            "level": task.complexity.level,
            "verifier": VERIFIER,
            "tools": tools,
            # a multi-turn task's later user turns (BFCL), played by the rollout core
            **({"turns": turns} if turns else {}),
            **({"new_tools": new_tools} if later else {}),
            # a simulated user's scenario, played by the rollout core through the llm tool
            # (and the tools it acts through, if any: the agent's rows never list them)
            **({"user_sim": user_sim} if simulated else {}),
        },
    }


def build_rows(
    pack: Pack,
    *,
    seed: int = 0,
    test_fraction: float = 0.1,
    prefix: str = "",
    levels: Collection[int] | None = None,
    user: str = "solo",
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}`` for the pack's tasks (of ``levels``, if given);
    ``user="simulated"`` needs a pack with user scenarios (tasks without one stay solo)."""
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be within [0, 1], got {test_fraction}")
    tasks = [t for t in pack.tasks if levels is None or t.complexity.level in levels]
    if not tasks:
        raise ValueError(f"pack {pack.id!r} has no tasks" + (f" of level {sorted(levels)}" if levels else ""))
    if user == "simulated" and not any(t.user_scenario for t in tasks):
        raise ValueError(
            f"pack {pack.id!r} has no task with a user scenario to simulate (τ² packs have them); "
            "build it with the user 'solo'"
        )
    split_of = {t.id: t.metadata["split"] for t in tasks if t.metadata.get("split") in SPLITS}
    free = [t.id for t in tasks if t.id not in split_of]
    random.Random(seed).shuffle(free)
    n_test = round(len(free) * test_fraction)
    split_of.update({task_id: "test" if i < n_test else "train" for i, task_id in enumerate(free)})
    rows: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    for task in tasks:  # the pack's order within a split
        split = split_of[task.id]
        rows[split].append(
            task_row(pack, task, split=split, index=len(rows[split]), prefix=prefix, user=user)
        )
    return rows


def _prompt(policy: str, prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policy as system text in front of the task's chat (one system message: templates want one)."""
    messages = [dict(m) for m in prompt]
    if not policy:
        return messages
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{policy.rstrip()}\n\n{messages[0].get('content') or ''}"
        return messages
    return [{"role": "system", "content": policy}, *messages]
