"""Worked examples for few-shot prompts: solved chats drawn beside a pack's tasks, never from them.

A small model (SmolLM2-135M) learns the call format from a few demonstrations. An
example is a task composed from its own rng stream on the pack's initial state (no
patch, no distractors), whose prompt is none of the pack's, solved by its gold calls:
the user's request, one assistant turn per dependency depth with its ``tool_calls``
(Hugging Face chat-template form: ``arguments`` is an object), the tool results, and the
final reply (the answer, or the facts to communicate). A pack whose tasks were generalised
(functional or parameter-type generalisation) gets examples drawn the same way, at 0.5.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tools.envs.pack import EnvTask, Pack, call_depths
from tools.envs.procedural import world_module
from tools.envs.procedural.compose import Options, compose_task

__all__ = ["solved_chat", "worked_examples"]


def worked_examples(
    p: Pack, count: int = 3, levels: Sequence[int] = (1, 2), seed: int = 0
) -> list[list[dict[str, Any]]]:
    """``count`` solved chats of ``p``'s world at ``levels`` (cycled), none with a prompt of ``p``'s tasks."""
    if p.info.origin != "procedural":
        raise ValueError(f"pack {p.id!r} is not procedural: its examples cannot be generated")
    module = world_module(p.info.domain)
    taken = {t.prompt[0]["content"] for t in p.tasks}
    options, typed = _generalised(p)
    chats: list[list[dict[str, Any]]] = []
    shown: set[tuple[str, ...]] = set()
    for index in range(count * 50):
        if len(chats) == count:
            break
        level = levels[len(chats) % len(levels)]
        rng = random.Random(f"{module.NAME}:{seed}:example:{index}:{level}")
        task = compose_task(module, f"example-{index}", level, rng, p.initial_state, options, typed)
        kinds = tuple(task.metadata["steps"])
        if task.prompt[0]["content"] in taken or (kinds in shown and index < count * 25):
            continue  # a new prompt, and a kind of step not shown yet while there are others
        taken.add(task.prompt[0]["content"])
        shown.add(kinds)
        chats.append(solved_chat(p, task))
    return chats


def solved_chat(p: Pack, task: EnvTask) -> list[dict[str, Any]]:
    """``task`` solved by its gold calls in a fresh world of ``p``: its prompt, one assistant turn
    per dependency depth with its ``tool_calls``, the tool results, and the final reply (the
    answer, or "Done." and the facts to communicate). Worked examples are such chats; so are
    the gold trajectories of a supervised warm start (``tools.data.gold``)."""
    world = p.new_world(task)
    depths = call_depths(task.gold.calls)
    chat: list[dict[str, Any]] = [*task.prompt]
    for depth in sorted(set(depths.values())):
        calls = [c for c in task.gold.calls if depths[c.id] == depth]
        chat.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ],
            }
        )
        for call in calls:
            output = p.call(world, call.name, call.arguments)
            chat.append({"role": "tool", "name": call.name, "content": json.dumps(output)})
    reply = task.gold.answer if task.gold.answer is not None else " ".join(["Done.", *task.gold.communicate])
    chat.append({"role": "assistant", "content": reply})
    return chat


def _generalised(p: Pack) -> tuple[Options, ModuleType | None]:
    """Options for ``p``'s examples: none of the knobs, but the generalisations its tasks show."""
    scaling = {s for t in p.tasks for s in t.complexity.scaling}
    functional = 0.5 if "functional_generalisation" in scaling else 0.0
    typed = "parameter_type_generalisation" in scaling
    options = Options(
        distractors=0,
        parameter_expansion=0.0,
        patched=0.0,
        functional_generalisation=functional,
        parameter_type_generalisation=0.5 if typed else 0.0,
    )
    return options, world_module(p.info.domain, typed=True) if typed else None
