"""Parsers on the output of a policy early in RL: mixes of good and broken calls, stray and
repeated tags, and megabytes of tags. No exception, every good call kept with its exact
arguments, one error per broken call, and time linear in the text.

The mixes come from a seeded ``random.Random``, so a failure names its seed and replays.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from trainer_client.parsers.registry import MAX_NESTING, ParsedCall, ParseOutcome, find_answer, get_parser

SEEDS = range(300)

# Text that stresses a parser inside string arguments: tags of every format, quotes,
# backslashes, special tokens, non-ASCII.
_TRICKY = [
    "<tool_call>", "</tool_call>", "<search>", "</search>", "<answer>", "</answer>", "<|im_end|>",
    '"', "'", "\\", "\\n", "{", "}", "[", "]", "(", ")", ";", ",", "=", "é", "東京", "😀", "\u200b",
    "\n", "\t", " ", "a", "bc", "NaN", "True", "None", "```",
]  # fmt: skip
_NAMES = ["search", "calc", "get_weather", "f", "x1", "read_file", "math_add"]


def _string(rng: random.Random, tricky: bool) -> str:
    pool = _TRICKY if tricky else ["a", "b c", "é", "東京", "😀", "1+1", "x_y", " ", "-"]
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 6)))


def _value(rng: random.Random, tricky: bool, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-(2**63), 2**63 - 1) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if kind == 3:
        return rng.choice([0.5, -2.25, 1e-7, 3.141592653589793, 1e300])
    if kind in (4, 5):
        return _string(rng, tricky)
    if kind == 6:
        return [_value(rng, tricky, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_string(rng, tricky) or "k": _value(rng, tricky, depth + 1) for _ in range(rng.randint(0, 3))}


def _arguments(rng: random.Random, tricky: bool) -> dict[str, Any]:
    return {f"arg_{i}": _value(rng, tricky) for i in range(rng.randint(0, 3))}


def _filler(rng: random.Random) -> str:
    """Text between calls: prose and JSON-looking noise, and an answer (calls written after
    it are still read: ending the trajectory on an answer is the rollout's decision)."""
    pool = [
        "",
        " ",
        "\n",
        "Let me call a tool. ",
        '{"not": "a call"} ',
        "é 😀 ",
        "[1, 2] ",
        "} ] ) ",
        "<answer>42</answer>",
    ]
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 3)))


Case = tuple[str, list[ParsedCall], int]  # text, the good calls in order, the broken count


def _mix(rng: random.Random, good: Callable[[], tuple[str, ParsedCall]], bad: Callable[[str], str]) -> Case:
    """Good and broken calls in random order with filler between them; ``bad`` gets the
    piece before it (a call left open must not be followed by a call never opened: the
    two read as one broken call)."""
    text, calls, broken, previous = _filler(rng), [], 0, ""
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.5:
            previous, call = good()
            calls.append(call)
        else:
            previous = bad(previous)
            broken += 1
        text += previous + _filler(rng)
    return text, calls, broken


# --------------------------------------------------------------------------- hermes


def _hermes_good(rng: random.Random) -> tuple[str, ParsedCall]:
    name = rng.choice(_NAMES)
    style = rng.randrange(5)
    arguments = _arguments(rng, tricky=style < 3)  # fences and Python dicts are read to </tool_call>
    key = rng.choice(["arguments", "parameters"])
    if style == 0:
        body = json.dumps({"name": name, key: arguments}, ensure_ascii=rng.random() < 0.5)
    elif style == 1:
        body = "\n" + json.dumps({"name": name, key: arguments}, indent=2) + "\n"
    elif style == 2:  # OpenAI style: the arguments as a JSON-encoded string
        body = json.dumps({"name": name, key: json.dumps(arguments)})
    elif style == 3:
        body = "```json\n" + json.dumps({"name": name, key: arguments}) + "\n```"
    else:
        body = repr({"name": name, key: arguments})  # single quotes, True/None
    return f"<tool_call>{body}</tool_call>", ParsedCall(name, arguments)


_HERMES_BAD_BODIES = [
    '{"name": "f", "arguments": {"a": 1 "b": 2}}',  # invalid JSON
    '{"arguments": {"a": 1}}',  # no name
    '{"name": "  ", "arguments": {}}',  # blank name
    '{"name": 7, "arguments": {}}',  # name not a string
    '{"name": "f", "arguments": [1, 2]}',  # arguments not an object
    '{"name": "f", "arguments": "{oops"}',  # arguments a string that is not JSON
    '{"name": "f", "arguments": "[1]"}',  # arguments a string that is not an object
    "[1, 2]",  # not an object
    "just words",
    "",
    "   \n ",
    '{"name": "f", "arguments": {"a": NaN}}',
    '{"name": "f", "arguments": {"a": 1e999}}',
    f'{{"name": "f", "arguments": {{"a": {2**70}}}}}',
    '{"name": "f", "arguments": {"a": "\\ud800"}}',  # lone surrogate
    '{"name": "f", "arguments": {"a": ' + "[" * (MAX_NESTING + 20) + "]" * (MAX_NESTING + 20) + "}}",
    "[" * 5000,
    '{"name": "f", "arguments": {"a": 1}} trailing words',
    "{'name': 'f', 'arguments': {'a': {1, 2}}}",  # a set
    "{'name': 'f', 'arguments': __import__('os').getcwd()}",
]


_UNCLOSED_CALL = '<tool_call>{"name": "f", "arguments": {"a": 1}'
_UNOPENED_CALL = '{"name": "f", "arguments": {}}</tool_call>'


def _hermes_case(seed: int) -> Case:
    rng = random.Random(seed)

    def bad(previous: str) -> str:
        kind = rng.randrange(10)
        if kind == 0:  # the closing tag is missing: caught by the next <tool_call> (or the end)
            return _UNCLOSED_CALL
        if kind == 1 and previous != _UNCLOSED_CALL:  # the opening tag is missing
            return _UNOPENED_CALL
        return f"<tool_call>{rng.choice(_HERMES_BAD_BODIES)}</tool_call>"

    return _mix(rng, lambda: _hermes_good(rng), bad)


# --------------------------------------------------------------------------- llama3_json


def _llama_case(seed: int) -> Case:
    rng = random.Random(seed)
    as_array = rng.random() < 0.5
    items: list[str] = []
    calls: list[ParsedCall] = []
    broken = 0
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            name, arguments = rng.choice(_NAMES), _arguments(rng, tricky=True)
            items.append(json.dumps({"name": name, rng.choice(["parameters", "arguments"]): arguments}))
            calls.append(ParsedCall(name, arguments))
        else:
            items.append(
                rng.choice(
                    [
                        '{"parameters": {}}',
                        '{"name": "", "parameters": {}}',
                        '{"name": "f", "parameters": [1]}',
                        '{"name": "f", "parameters": {"a": NaN}}',
                        f'{{"name": "f", "parameters": {{"a": {2**70}}}}}',
                        '{"name": "f", "parameters": {"a": "\\udfff"}}',
                    ]
                    + (["3", '"call"', "null"] if as_array else [])
                )
            )
            broken += 1
    if as_array:
        if not any(item.startswith("{") for item in items):
            broken = 0  # '["call", 3]' holds no object: an ordinary reply, not calls
        return "<|python_tag|>[" + ", ".join(items) + "]", calls, broken
    return rng.choice(["", "<|python_tag|>"]) + "; ".join(items), calls, broken


# --------------------------------------------------------------------------- pythonic


def _pythonic_case(seed: int) -> Case:
    rng = random.Random(seed)
    items: list[str] = []
    calls: list[ParsedCall] = []
    broken = 0
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            name, arguments = rng.choice(_NAMES), _arguments(rng, tricky=True)
            items.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")
            calls.append(ParsedCall(name, arguments))
        else:
            items.append(
                rng.choice(
                    [
                        "f(1)",  # positional, no schema
                        "f(a=b)",  # not a literal
                        "f(**kw)",
                        "f(a={1, 2})",  # a set
                        "f(a=b'x')",
                        "f(a=1j)",
                        "f(a=1)(b=2)",  # not a tool name
                        "3",  # not a call
                        f"f(a={2**70})",
                    ]
                )
            )
            broken += 1
    if not calls and all(item == "3" for item in items):
        broken = 0  # "[3, 3]" is a plain list: an ordinary reply, not calls
    return "[" + ", ".join(items) + "]", calls, broken


# --------------------------------------------------------------------------- search_r1


def _search_case(seed: int) -> Case:
    rng = random.Random(seed)

    def good() -> tuple[str, ParsedCall]:
        query = (_string(rng, tricky=False) + "q").strip()
        return f"<search>{query}</search>", ParsedCall("search", {"query": query})

    def bad(previous: str) -> str:
        kinds = ["<search> \n </search>", "<search></search>", "<search>never closed"]
        return rng.choice(kinds + ["lost query</search>"] * (previous != kinds[-1]))

    return _mix(rng, good, bad)


# each format: how to build its parser, and a seeded mix of good and broken calls
FORMATS = {
    "hermes": ({"parallel_calls": True}, _hermes_case),
    "llama3_json": ({}, _llama_case),
    "pythonic": ({}, _pythonic_case),
    "search_r1": ({}, _search_case),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_parser_keeps_every_good_call_and_reports_every_broken_one(fmt: str, seed: int) -> None:
    options, case = FORMATS[fmt]
    text, calls, broken = case(seed)
    outcome = get_parser(fmt, **options).parse(text)
    assert outcome.calls == calls, text
    assert len(outcome.errors) == broken, (text, outcome.errors)
    _assert_readable(outcome)


def _assert_readable(outcome: ParseOutcome) -> None:
    for error in outcome.errors:
        assert isinstance(error, str) and error
        error.encode("utf-8")
    for call in outcome.calls:
        json.dumps(call.arguments, allow_nan=False)


# --------------------------------------------------------------------------- tags


def test_hermes_a_missing_close_tag_does_not_swallow_the_next_call() -> None:
    good = '<tool_call>{"name": "b", "arguments": {"x": "</tool_call> in a string"}}</tool_call>'
    outcome = get_parser("hermes").parse('<tool_call>{"name": "a", "arguments": {}' + good)
    assert outcome.calls == [ParsedCall("b", {"x": "</tool_call> in a string"})]
    assert outcome.errors == [
        "<tool_call> was opened again before </tool_call> closed the call before it; "
        'expected {"name": ..., "arguments": {...}}'
    ]


def test_hermes_a_doubled_tag_keeps_the_call_inside_it() -> None:
    outcome = get_parser("hermes").parse(
        '<tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call></tool_call>'
    )
    assert outcome.calls == [ParsedCall("a", {})]
    assert len(outcome.errors) == 2  # the opener with no call, the closer with none


def test_hermes_reports_a_call_without_its_opening_tag() -> None:
    outcome = get_parser("hermes").parse('{"name": "a", "arguments": {}}</tool_call>')
    assert outcome.calls == []
    assert outcome.errors == [
        '</tool_call> closes no <tool_call>: open each call with <tool_call>; expected {"name": ..., "arguments": {...}}'
    ]


def test_hermes_a_tag_inside_a_string_argument_is_text() -> None:
    text = (
        '<tool_call>{"name": "echo", "arguments": {"text": "use <tool_call> and </tool_call>"}}</tool_call>'
    )
    outcome = get_parser("hermes").parse(text)
    assert (outcome.calls, outcome.errors) == (
        [ParsedCall("echo", {"text": "use <tool_call> and </tool_call>"})],
        [],
    )


def test_search_r1_a_reopened_tag_does_not_swallow_the_next_query() -> None:
    outcome = get_parser("search_r1").parse("<search>first<search>second</search>")
    assert outcome.calls == [ParsedCall("search", {"query": "second"})]
    assert outcome.errors == ["<search> was opened again before </search> closed the query before it"]
    stray = get_parser("search_r1").parse("a query</search>")
    assert (stray.calls, stray.errors) == ([], ["</search> closes no <search>: write <search>query</search>"])


def test_find_answer_takes_the_first_opener_that_is_closed() -> None:
    assert find_answer("<answer>a<answer>b</answer>") == "a<answer>b"
    assert find_answer("x</answer><answer> y </answer>") == "y"
    assert find_answer("<answer>open") is None
    assert find_answer("no answer") is None


# --------------------------------------------------------------------------- megabytes

MB = 1_000_000
_CALL = '<tool_call>{"name":"a","arguments":{}}</tool_call>'

# Each of these took minutes to hours with the regular expressions and the bracket
# pre-scan they replace (quadratic: 0.5 MB of "<answer>" took 230 s); the timeout only
# guards against a hang, the assertions check the outcome.
_HUGE: list[tuple[str, str, str, Callable[[ParseOutcome], bool]]] = [
    ("openers", "hermes", "<tool_call>" * (MB // 11), lambda o: len(o.errors) == MB // 11 and not o.calls),
    (
        "openers-closed",
        "hermes",
        "<tool_call>" * (MB // 11) + "</tool_call>",
        lambda o: len(o.errors) == MB // 11,
    ),
    ("answer-openers", "hermes", "<answer>" * (MB // 8), lambda o: o.final_answer is None and not o.errors),
    (
        "fence-newlines",
        "hermes",
        "<tool_call>```{" + "\n" * MB + "x```</tool_call>",
        lambda o: len(o.errors) == 1,
    ),
    (
        "fence-spaces",
        "hermes",
        "<tool_call>```{" + " " * MB + "x```</tool_call>",
        lambda o: len(o.errors) == 1,
    ),
    ("search-openers", "search_r1", "<search>" * (MB // 8), lambda o: len(o.errors) == MB // 8),
    (
        "answer-closed",
        "search_r1",
        "<answer>" * (MB // 8) + "</answer>",
        lambda o: o.final_answer is not None,
    ),
    (
        "objects",
        "llama3_json",
        '{"name":"a","parameters":{}};' * (4 * MB // 29),
        lambda o: len(o.calls) == 4 * MB // 29,
    ),
    ("braces", "llama3_json", "{" * MB, lambda o: len(o.errors) == 1),
    ("call-list", "pythonic", "[" + "f(a=1), " * (MB // 32) + "]", lambda o: len(o.calls) == MB // 32),
    ("nested-call-lists", "pythonic", "[f(a=1), " * (MB // 9), lambda o: len(o.errors) == 1),
    ("brackets", "pythonic", "[" * MB, lambda o: not o.errors),  # "[[[..." is not a call list
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "text", "check"), [h[1:] for h in _HUGE], ids=[h[0] for h in _HUGE])
def test_megabytes_of_tags_parse_in_linear_time(
    name: str, text: str, check: Callable[[ParseOutcome], bool]
) -> None:
    options = {"parallel_calls": True} if name == "hermes" else {}
    outcome = get_parser(name, **options).parse(text)
    assert check(outcome), (len(outcome.calls), outcome.errors[:3], outcome.final_answer)


@pytest.mark.timeout(120)
def test_megabytes_of_calls_are_all_parsed() -> None:
    n = 4 * MB // len(_CALL)
    outcome = get_parser("hermes", parallel_calls=True).parse(_CALL * n)
    assert outcome.calls == [ParsedCall("a", {})] * n and outcome.errors == []
