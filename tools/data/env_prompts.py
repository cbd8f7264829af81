"""Few-shot text prompts for environment tasks, for models whose chat template shows no tools.

SmolLM2-135M's template renders neither ``tools=`` nor assistant ``tool_calls``: the model
sees message text only. So, as for arithmetic (``tools/data/arithmetic.py``), the prompt
says everything in text:

- system: the pack's policy, one line per tool the task exposes (name, arguments,
  description) and the hermes call format;
- ``shots`` worked examples (``tools.envs.procedural.examples.worked_examples``), each a
  user turn, then per call an assistant turn with one ``<tool_call>`` block and its
  result as a ``tool`` turn (the role the rollout core writes real results with), then
  the reply (``<answer>...</answer>`` for a question, ``Done. ...`` for a change);
- the task's own user turn.

Examples are chosen per task from a pool so that between them they show as many of the
task's tools as they can (a 135M model copies a demonstrated call far better than it reads
a schema), then by the pool's order. For tasks that need several calls,
``few_shot_rows(..., example_levels=[1, 2, 3, 4])`` shows one example per level (one call; two
calls; a chain whose second call uses the first one's output; three calls) and
``MULTI_CALL_FORMAT`` says in words that a task may need several calls. :func:`prompt_rows` rewrites the prompt of
``tools.data.environments`` rows and keeps their ground truth and ``extra_info``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CALL_FORMAT",
    "MULTI_CALL_FORMAT",
    "TAGGED_MULTI_CALL_FORMAT",
    "build_env_prompt",
    "example_messages",
    "few_shot_rows",
    "prompt_rows",
    "tool_lines",
]

CALL_FORMAT = (
    "To call a tool, write:\n"
    '<tool_call>\n{"name": "TOOL", "arguments": {"ARG": "VALUE"}}\n</tool_call>\n'
    "The result comes back in the next message; make one call at a time. Then answer a question as "
    "<answer>ANSWER</answer>, or say Done. after a change."
)
# The same format, saying that a task may take several calls and that results feed later calls:
# a 135M model that learned one call per task otherwise answers after the first result.
MULTI_CALL_FORMAT = (
    "To call a tool, write:\n"
    '<tool_call>\n{"name": "TOOL", "arguments": {"ARG": "VALUE"}}\n</tool_call>\n'
    "The result comes back in the next message. A task may need several calls: make them one at a "
    "time, each in its own message, and use what a result tells you (an id, a balance) in the next "
    "call. When every call the task needs is done, answer a question as <answer>ANSWER</answer>, "
    "or say Done. after a change."
)
# One reply format for every task: a 135M model shown "<answer>" after questions and "Done." after
# changes ends everything with "Done." (examples/README.md, the multi-step run); with this one the
# reply is always tagged and a change's reply is "<answer>Done. ...</answer>".
TAGGED_MULTI_CALL_FORMAT = (
    "To call a tool, write:\n"
    '<tool_call>\n{"name": "TOOL", "arguments": {"ARG": "VALUE"}}\n</tool_call>\n'
    "The result comes back in the next message. A task may need several calls: make them one at a "
    "time, each in its own message, and use what a result tells you (an id, a balance) in the next "
    "call. When every call the task needs is done, always end with <answer>...</answer>: the answer "
    "to a question, or <answer>Done.</answer> after a change."
)
Chat = list[dict[str, Any]]


def tool_lines(tools: Sequence[Mapping[str, Any]]) -> str:
    """One line per MCP tool descriptor: ``- name(arg: type, opt?: type): description``."""
    lines = []
    for tool in tools:
        schema = tool.get("inputSchema") or tool.get("input_schema") or {}
        required = set(schema.get("required", ()))
        args = ", ".join(
            f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
            for name, spec in (schema.get("properties") or {}).items()
        )
        description = (tool.get("description") or "").strip().split("\n")[0]
        lines.append(f"- {tool['name']}({args}): {description}")
    return "\n".join(lines)


def _call_block(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _compact(content: Any) -> str:
    """A tool result as compact JSON text (the server's results are JSON too)."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            return content
    return json.dumps(content, separators=(",", ":"))


def example_messages(chat: Sequence[Mapping[str, Any]], *, tagged_replies: bool = False) -> Chat:
    """A solved chat (Hugging Face ``tool_calls`` form) as plain text turns in the hermes format.

    One call per assistant turn, each followed by its result: the trainer's hermes parser
    ends a turn at the first ``</tool_call>``, so that is how the model's own turns go.
    ``tagged_replies``: every final reply in ``<answer>`` tags, "Done. ..." after a change too.
    """
    messages: Chat = []
    pending: list[Mapping[str, Any]] = []  # calls of the last assistant turn, awaiting their results
    for message in chat:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            pending = list(message["tool_calls"])
        elif role == "tool":
            if not pending:
                raise ValueError("a tool result without a call before it")
            call = pending.pop(0)["function"]
            messages.append({"role": "assistant", "content": _call_block(call["name"], call["arguments"])})
            messages.append({"role": "tool", "content": _compact(message.get("content"))})
        elif role == "assistant":
            reply = str(message.get("content") or "").strip()
            # worked_examples replies "Done. <facts>" after a change, the bare answer to a question
            text = reply if reply.startswith("Done.") and not tagged_replies else f"<answer>{reply}</answer>"
            messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": role, "content": message.get("content") or ""})
    return messages


def _tools_used(chat: Sequence[Mapping[str, Any]]) -> set[str]:
    return {
        call["function"]["name"]
        for m in chat
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
    }


def _choose(
    pool: Sequence[Chat], tools: set[str], shots: int, pool_levels: Sequence[int] | None = None
) -> list[Chat]:
    """``shots`` examples that between them show the most of ``tools``, shown in pool order.

    Greedy cover: each pick adds the most tools not shown yet, ties in pool order. A prompt listing all of a world's tools thus gets examples that use
    different ones, not two that repeat the same call.
    """
    used = [_tools_used(chat) & tools for chat in pool]
    chosen: list[int] = []
    shown: set[str] = set()
    # ``pool_levels``: the level of each pool chat; then one chat per level, levels in order
    wanted: list[int | None] = list(dict.fromkeys(pool_levels)) if pool_levels else [None] * shots
    for level in wanted:
        best = min(
            (
                i
                for i in range(len(pool))
                if i not in chosen and (level is None or (pool_levels and pool_levels[i] == level))
            ),
            key=lambda i: (-len(used[i] - shown), i),
        )
        chosen.append(best)
        shown |= used[best]
    return [pool[i] for i in (chosen if pool_levels else sorted(chosen))]


def build_env_prompt(
    policy: str,
    tools: Sequence[Mapping[str, Any]],
    task_prompt: Sequence[Mapping[str, Any]],
    examples: Sequence[Chat],
    shots: int = 2,
    *,
    call_format: str = CALL_FORMAT,
    pool_levels: Sequence[int] | None = None,
    tagged_replies: bool = False,
) -> Chat:
    """System (policy, tools, call format), ``shots`` worked examples from ``examples``, the task's turns.

    ``pool_levels``: the level of each of ``examples``; then one example per level is shown,
    in level order (``shots`` must be the number of levels)."""
    if pool_levels is not None and shots != len(set(pool_levels)):
        raise ValueError(f"shots must be the {len(set(pool_levels))} example levels, got {shots}")
    if shots < 0 or shots > len(examples):
        raise ValueError(f"shots must be between 0 and the {len(examples)} examples given, got {shots}")
    turns = [dict(m) for m in task_prompt]
    system = [policy.strip()] if policy.strip() else []
    if turns and turns[0].get("role") == "system":
        system.append(str(turns.pop(0).get("content") or "").strip())
    system += ["You have these tools:\n" + tool_lines(tools), call_format]
    chosen = _choose(examples, {str(t["name"]) for t in tools}, shots, pool_levels)
    return [
        {"role": "system", "content": "\n\n".join(system)},
        *(m for chat in chosen for m in example_messages(chat, tagged_replies=tagged_replies)),
        *turns,
    ]


def prompt_rows(
    rows: Sequence[Mapping[str, Any]],
    policy: str,
    task_prompts: Mapping[str, Sequence[Mapping[str, Any]]],
    examples: Sequence[Chat],
    shots: int = 2,
    **options: Any,
) -> list[dict[str, Any]]:
    """``tools.data.environments`` rows with few-shot text prompts (``task_prompts``: task id -> its chat;
    ``options``: ``build_env_prompt``'s)."""
    out = []
    for row in rows:
        info = row["extra_info"]
        prompt = build_env_prompt(
            policy, info["tools"], task_prompts[info["task"]], examples, shots, **options
        )
        out.append({**row, "prompt": prompt})
    return out


EXAMPLE_POOL = 8  # worked examples drawn beside the pack; each prompt shows the best-matching `shots`


def few_shot_rows(
    pack: Any,
    rows: Mapping[str, Sequence[Mapping[str, Any]]],
    shots: int,
    levels: Sequence[int],
    seed: int,
    *,
    example_levels: Sequence[int] | None = None,
    call_format: str = CALL_FORMAT,
    tagged_replies: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """``tools.data.environments`` rows per split with few-shot text prompts: worked examples
    drawn beside a procedural pack's tasks (ValueError for any other pack).

    ``example_levels`` (e.g. ``[1, 2, 3, 4]``): one example of each of these levels, in order
    (``shots`` must be their number), instead of ``shots`` examples of ``levels``."""
    from tools.envs.procedural.examples import worked_examples

    if example_levels is None:
        pool = worked_examples(pack, count=max(EXAMPLE_POOL, shots), levels=sorted(levels), seed=seed)
        options: dict[str, Any] = {"call_format": call_format, "tagged_replies": tagged_replies}
    else:
        drawn = sorted(set(example_levels))
        count = EXAMPLE_POOL // len(drawn) * len(drawn) or len(drawn)
        pool = worked_examples(pack, count=count, levels=drawn, seed=seed)
        # worked_examples cycles through the levels: the i-th chat is of level drawn[i % len]
        pool_levels = [drawn[i % len(drawn)] for i in range(len(pool))]
        options = {"call_format": call_format, "pool_levels": pool_levels, "tagged_replies": tagged_replies}
    prompts = {t.id: t.prompt for t in pack.tasks}
    return {
        split: prompt_rows(split_rows, pack.policy, prompts, pool, shots, **options)
        for split, split_rows in rows.items()
    }
