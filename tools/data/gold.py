"""Gold turns for a supervised warm start: what the policy would have written to solve a training task.

``trainer-client sft --gold FILE`` replays these turns through the rollout core against the
tool server (real observations, the rollout's own token splice and masks) and trains on the
trajectories that the verifier scores as solved. The turns are the task's gold calls in the
call format of its few-shot prompt (``env_prompts.example_messages``: one ``<tool_call>`` per
assistant turn, then the reply, ``<answer>...</answer>`` or ``Done. ...``), exactly as the
prompt's worked examples show them.

Held-out tasks never get gold turns: ``gold_script`` refuses a row whose ``extra_info.split``
is not ``train`` (and ``trainer-client sft`` refuses such rows again), so a warm start cannot
see the tasks it is evaluated on.

    entries = gold_script(pack, rows["train"], tagged_replies=False)
    write_gold(entries, out / "gold.jsonl")   # {"task": id, "turns": [...]} a line
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.data.env_prompts import example_messages

__all__ = ["TRAIN_SPLIT", "gold_script", "gold_turns", "write_gold"]

TRAIN_SPLIT = "train"


def gold_turns(pack: Any, task: Any, *, tagged_replies: bool = False) -> list[str]:
    """The assistant turns that solve ``task`` of the procedural ``pack`` with its gold calls."""
    from tools.envs.procedural.examples import solved_chat

    messages = example_messages(solved_chat(pack, task), tagged_replies=tagged_replies)
    return [m["content"] for m in messages[len(task.prompt) :] if m["role"] == "assistant"]


def gold_script(
    pack: Any, rows: Sequence[Mapping[str, Any]], *, tagged_replies: bool = False
) -> list[dict[str, Any]]:
    """``{"task": id, "turns": [...]}`` for each row (``tools.data.environments`` rows of ``pack``);
    ValueError for a row that is not of the training split or not of ``pack``."""
    tasks = {t.id: t for t in pack.tasks}
    entries = []
    for row in rows:
        info = row["extra_info"]
        if info.get("split") != TRAIN_SPLIT:
            raise ValueError(
                f"task {info.get('task')!r} is of the {info.get('split')!r} split: gold turns are written for "
                "training rows only (held-out tasks must stay unseen)"
            )
        if info.get("pack") != pack.id or info.get("task") not in tasks:
            raise ValueError(
                f"row of pack {info.get('pack')!r}, task {info.get('task')!r}: not a task of {pack.id}"
            )
        turns = gold_turns(pack, tasks[info["task"]], tagged_replies=tagged_replies)
        entries.append({"task": info["task"], "turns": turns})
    return entries


def write_gold(entries: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """One JSON line per entry (the ``--gold`` file of ``trainer-client sft``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(dict(e)) + "\n" for e in entries))
    return path
