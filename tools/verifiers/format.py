"""``format``: is the trajectory well formed? Tags, one final answer, tool-call JSON, call count.

It looks only at what the model wrote: every assistant message (each checked on its own,
since tool results come in between) or ``response`` alone. Components, each in [0, 1]:

- ``tags_balanced``: the fraction of assistant turns whose tags (``tags`` option,
  default think/answer/tool_call/search) open and close properly nested, none left open;
- ``single_answer``: exactly one ``<answer>…</answer>`` over the whole trajectory, and
  it sits in the last assistant turn (options ``require_answer``, default true: without
  it zero answers also pass, and only "at most one, in the last turn" is checked);
- ``tool_call_json``: the fraction of ``<tool_call>`` bodies that are a JSON object with a
  string ``name`` and an object ``arguments`` (hermes format); 1.0 when there are none;
- ``tool_call_count``: 1.0 when the number of calls (``<tool_call>`` and ``<search>``
  blocks, plus OpenAI-style ``tool_calls`` entries on messages) is within
  [``min_calls``, ``max_calls``] (defaults 0 and unbounded), else
  ``max(0, 1 - call_penalty * distance)`` (``call_penalty`` default 1: all or nothing).

``score`` is the weighted mean of the components (``weights`` option, default equal);
``details.problems`` lists what failed in words.
"""

from __future__ import annotations

import json
import re
from typing import Any

from protocol import VerifyRequest, VerifyResult, verifier
from tools.verifiers.text import ANSWER_CLOSE, ANSWER_OPEN, assistant_texts

DEFAULT_TAGS = ("think", "answer", "tool_call", "search")
CALL_TAGS = ("tool_call", "search")
COMPONENTS = ("tags_balanced", "single_answer", "tool_call_json", "tool_call_count")
_TAG_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}
_TOOL_CALL_BODY = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _tag_pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    pattern = _TAG_PATTERNS.get(tags)
    if pattern is None:
        names = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
        pattern = _TAG_PATTERNS[tags] = re.compile(rf"<(/?)({names})>")
    return pattern


def tag_problem(text: str, tags: tuple[str, ...] = DEFAULT_TAGS) -> str | None:
    """Why the tags in ``text`` are not well formed, or None when they are."""
    stack: list[str] = []
    for match in _tag_pattern(tags).finditer(text):
        closing, name = match.group(1), match.group(2)
        if not closing:
            if name in stack:
                return f"<{name}> opened inside another <{name}>"
            stack.append(name)
        elif not stack:
            return f"</{name}> without an opening tag"
        elif stack[-1] != name:
            return f"</{name}> closes while <{stack[-1]}> is still open"
        else:
            stack.pop()
    return f"<{stack[-1]}> is never closed" if stack else None


def tool_call_problem(body: str) -> str | None:
    """Why one ``<tool_call>`` body is not a hermes call object, or None when it is."""
    try:
        call = json.loads(body)
    except ValueError as exc:
        return f"tool call is not valid JSON ({exc})"
    if not isinstance(call, dict):
        return f"tool call must be a JSON object, got {type(call).__name__}"
    if not isinstance(call.get("name"), str) or not call["name"]:
        return 'tool call needs a non-empty string "name"'
    if not isinstance(call.get("arguments", {}), dict):
        return 'tool call "arguments" must be an object'
    return None


def count_calls(request: VerifyRequest, texts: list[str]) -> int:
    """Tool calls made in the trajectory: call tags in the text plus structured ``tool_calls``."""
    tagged = sum(text.count(f"<{tag}>") for text in texts for tag in CALL_TAGS)
    structured = sum(
        len(m.get("tool_calls") or ()) for m in request.response_messages() if m.get("role") == "assistant"
    )
    return tagged + structured


def _number(arguments: dict[str, Any], key: str, default: float | None) -> float | None:
    value = arguments.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f'format option "{key}" must be a number, got {value!r}')
    return float(value)


def _options(arguments: dict[str, Any]) -> dict[str, Any]:
    """Validated options; ValueError says which one is wrong."""
    tags = arguments.get("tags") or DEFAULT_TAGS
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) and t for t in tags):
        raise ValueError(f'format option "tags" must be a list of tag names, got {tags!r}')
    weights = arguments.get("weights") or {}
    if not isinstance(weights, dict):
        raise ValueError(f'format option "weights" must be an object, got {weights!r}')
    unknown = set(weights) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown format weights {sorted(unknown)}; known: {list(COMPONENTS)}")
    max_calls = _number(arguments, "max_calls", None)
    return {
        "tags": tuple(tags),
        "weights": {name: _number(weights, name, 1.0) for name in COMPONENTS},
        "min_calls": int(_number(arguments, "min_calls", 0) or 0),
        "max_calls": None if max_calls is None else int(max_calls),
        "call_penalty": _number(arguments, "call_penalty", 1.0),
        "require_answer": bool(arguments.get("require_answer", True)),
    }


@verifier(name="format", timeout_s=5.0, blocking=False)
def format_check(request: VerifyRequest) -> VerifyResult:
    """Score how well formed the model's output is; see the module docstring for the checks."""
    try:
        options = _options(request.arguments)
    except ValueError as exc:
        return VerifyResult(0.0, dict.fromkeys(COMPONENTS, 0.0), {"error": str(exc)})
    tags = options["tags"]
    texts = assistant_texts(request)
    problems: list[str] = []
    components: dict[str, float] = {}

    # Tags: per assistant turn.
    balanced = 0
    for i, text in enumerate(texts):
        problem = tag_problem(text, tags)
        if problem is None:
            balanced += 1
        else:
            problems.append(f"turn {i}: {problem}")
    components["tags_balanced"] = balanced / len(texts) if texts else 0.0
    if not texts:
        problems.append("no assistant output")

    # Exactly one final answer, in the last turn.
    answers = [text.count(ANSWER_OPEN) for text in texts]
    total_answers = sum(answers)
    last_has_answer = bool(texts) and answers[-1] == 1 and ANSWER_CLOSE in texts[-1]
    if options["require_answer"]:
        single = total_answers == 1 and last_has_answer
    else:
        single = total_answers == 0 or (total_answers == 1 and last_has_answer)
    components["single_answer"] = 1.0 if single else 0.0
    if not single:
        where = "" if last_has_answer or total_answers == 0 else " (not closed in the last turn)"
        problems.append(f"{total_answers} <answer> blocks, expected exactly one{where}")

    # Tool-call JSON.
    bodies = [body for text in texts for body in _TOOL_CALL_BODY.findall(text)]
    valid = 0
    for body in bodies:
        problem = tool_call_problem(body)
        if problem is None:
            valid += 1
        else:
            problems.append(problem)
    components["tool_call_json"] = valid / len(bodies) if bodies else 1.0

    # Tool-call count.
    min_calls, max_calls = options["min_calls"], options["max_calls"]
    calls = count_calls(request, texts)
    distance = max(0, min_calls - calls) + (max(0, calls - max_calls) if max_calls is not None else 0)
    components["tool_call_count"] = max(0.0, 1.0 - options["call_penalty"] * distance) if distance else 1.0
    if distance:
        upper = "any number" if max_calls is None else str(max_calls)
        problems.append(f"{calls} tool calls, expected between {min_calls} and {upper}")

    weights = options["weights"]
    total_weight = sum(weights.values())
    score = (
        sum(weights[name] * components[name] for name in COMPONENTS) / total_weight
        if total_weight > 0
        else 0.0
    )
    return VerifyResult(score, components, {"problems": problems, "tool_calls": calls, "turns": len(texts)})
