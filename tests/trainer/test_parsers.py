"""Tool-call parsers: formats, error messages the model sees, and robustness on any text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_client.parsers import (
    HermesParser,
    ParsedCall,
    ToolCallParser,
    find_answer,
    get_parser,
    parser_names,
    register_parser,
)

# --------------------------------------------------------------------------- hermes


def test_hermes_parses_several_calls_with_whitespace_and_fences() -> None:
    text = (
        "I will look both up.\n<tool_call>\n"
        '  {"name": "search", "arguments": {"query": "Paris"}}  \n</tool_call>\n'
        '<tool_call>```json\n{"name": "calc", "arguments": {"expr": "2+3"}}\n```</tool_call>'
    )
    outcome = get_parser("hermes").parse(text)
    assert outcome.calls == [ParsedCall("search", {"query": "Paris"}), ParsedCall("calc", {"expr": "2+3"})]
    assert outcome.errors == []
    assert outcome.final_answer is None


def test_hermes_accepts_single_quotes_parameters_key_and_string_arguments() -> None:
    parser = get_parser("hermes")
    assert parser.parse("<tool_call>{'name': 'echo', 'arguments': {'text': 'hi'}}</tool_call>").calls == [
        ParsedCall("echo", {"text": "hi"})
    ]
    assert parser.parse('<tool_call>{"name": "echo", "parameters": {"text": "hi"}}</tool_call>').calls == [
        ParsedCall("echo", {"text": "hi"})
    ]
    encoded = json.dumps({"name": "echo", "arguments": json.dumps({"text": "hi"})})
    assert parser.parse(f"<tool_call>{encoded}</tool_call>").calls == [ParsedCall("echo", {"text": "hi"})]
    assert parser.parse('<tool_call>{"name": "now"}</tool_call>').calls == [ParsedCall("now", {})]


def test_hermes_invalid_json_error_says_where_and_what_is_expected() -> None:
    outcome = get_parser("hermes").parse(
        '<tool_call>{"name": "add", "arguments": {"a": 1 "b": 2}}</tool_call>'
    )
    assert outcome.calls == []
    assert outcome.errors == [
        "invalid JSON in <tool_call>: Expecting ',' delimiter at char 37; "
        'expected {"name": ..., "arguments": {...}}'
    ]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("[1, 2]", "must hold a JSON object, got list"),
        ('{"arguments": {}}', '"name" must be a non-empty string'),
        ('{"name": "", "arguments": {}}', '"name" must be a non-empty string'),
        ('{"name": "x", "arguments": [1]}', '"arguments" must be a JSON object, got list'),
        ('{"name": "x", "arguments": "{oops"}', 'invalid JSON in the "arguments" string of <tool_call>'),
        ("", "empty <tool_call></tool_call>"),
    ],
)
def test_hermes_structural_errors(body: str, fragment: str) -> None:
    outcome = get_parser("hermes").parse(f"<tool_call>{body}</tool_call>")
    assert outcome.calls == []
    assert len(outcome.errors) == 1
    assert fragment in outcome.errors[0]


def test_hermes_reports_unclosed_call_and_keeps_good_ones() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b"'
    outcome = get_parser("hermes").parse(text)
    assert outcome.calls == [ParsedCall("a", {})]
    assert outcome.errors == [
        '<tool_call> was opened but never closed with </tool_call>; expected {"name": ..., "arguments": {...}}'
    ]


def test_hermes_stop_strings_depend_on_parallel_calls() -> None:
    assert get_parser("hermes").stop_strings == ("</tool_call>", "</answer>")
    assert get_parser("hermes", parallel_calls=True).stop_strings == ("</answer>",)


def test_answer_ends_and_plain_text_has_nothing() -> None:
    parser = get_parser("hermes")
    assert parser.parse("So it is <answer> Paris </answer>").final_answer == "Paris"
    plain = parser.parse("Just chatting, no tools.")
    assert (plain.calls, plain.errors, plain.final_answer) == ([], [], None)
    assert find_answer("<answer>unfinished") is None


# --------------------------------------------------------------------------- search_r1


def test_search_r1_calls_the_search_tool() -> None:
    parser = get_parser("search_r1")
    assert parser.stop_strings == ("</search>", "</answer>")
    outcome = parser.parse("<think>need facts</think><search> capital of France </search>")
    assert outcome.calls == [ParsedCall("search", {"query": "capital of France"})]
    assert parser.parse("<search>  </search>").errors == [
        "empty <search></search>: write the search query between the tags"
    ]
    assert parser.parse("<search>never closed").errors == [
        "<search> was opened but never closed with </search>"
    ]
    assert parser.parse("<answer>Paris</answer>").final_answer == "Paris"
    custom = get_parser("search_r1", tool_name="wiki", argument="q")
    assert custom.parse("<search>x</search>").calls == [ParsedCall("wiki", {"q": "x"})]


# --------------------------------------------------------------------------- llama3_json / pythonic


def test_llama3_json_parses_bare_objects() -> None:
    parser = get_parser("llama3_json")
    text = '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "now", "parameters": {}}'
    assert parser.parse(text).calls == [ParsedCall("add", {"a": 1, "b": 2}), ParsedCall("now", {})]
    assert parser.parse("The weather is {unknown} today").calls == []
    broken = parser.parse('{"name": "add", "parameters": {"a": 1,}}')
    assert broken.calls == []
    assert broken.errors[0].startswith("invalid JSON in the tool call: Expecting property name")


def test_pythonic_uses_literals_only() -> None:
    parser = get_parser("pythonic")
    outcome = parser.parse('[get_weather(city="Paris", days=3), math.add(a=1.5, b=[1, 2])]')
    assert outcome.calls == [
        ParsedCall("get_weather", {"city": "Paris", "days": 3}),
        ParsedCall("math.add", {"a": 1.5, "b": [1, 2]}),
    ]
    evil = parser.parse('[run(cmd=__import__("os").system("echo pwned"))]')
    assert evil.calls == []
    assert evil.errors == [
        'run(...): argument cmd is not a literal value; expected [tool_name(arg="value", ...)] with literal arguments'
    ]
    assert "positional" in parser.parse("[f(1)]").errors[0]
    assert parser.parse("[f(a=1)").calls == []  # not a list: plain text, no calls
    assert parser.parse("[f(a=)]").errors[0].startswith("invalid call list:")
    plain_list = parser.parse("[1, 2, 3]")  # an ordinary reply, not calls
    assert (plain_list.calls, plain_list.errors) == ([], [])
    mixed = parser.parse("[f(a=1), 3]")
    assert mixed.calls == [ParsedCall("f", {"a": 1})]
    assert mixed.errors == [
        "list item '3' is not a call; expected [tool_name(arg=\"value\", ...)] with literal arguments"
    ]


# --------------------------------------------------------------------------- registry


def test_registry() -> None:
    assert {"hermes", "search_r1", "llama3_json", "pythonic"} <= set(parser_names())
    with pytest.raises(ValueError, match="unknown tool-call format 'nope'; known formats: "):
        get_parser("nope")
    with pytest.raises(ValueError, match="bad options for tool-call format 'hermes'"):
        get_parser("hermes", colour="red")
    register_parser("hermes_parallel", lambda: HermesParser(parallel_calls=True))
    parser = get_parser("hermes_parallel")
    assert isinstance(parser, ToolCallParser)
    assert parser.stop_strings == ("</answer>",)


# --------------------------------------------------------------------------- properties

_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), _json_values, max_size=4)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_names, _arguments), min_size=1, max_size=4), st.text(max_size=30))
def test_hermes_round_trip(calls: list[tuple[str, dict]], filler: str) -> None:
    filler = filler.replace("<", " ")
    text = filler + "".join(
        f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>{filler}" for n, a in calls
    )
    outcome = get_parser("hermes").parse(text)
    assert outcome.errors == []
    assert outcome.calls == [ParsedCall(n, a) for n, a in calls]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            list("<>/{}[]()\"':,= \nabc_") + ["<tool_call>", "</tool_call>", "<search>", "</search>"]
        ),
        max_size=60,
    ).map("".join),
    st.sampled_from(["hermes", "search_r1", "llama3_json", "pythonic"]),
)
def test_parsers_never_raise(text: str, name: str) -> None:
    outcome = get_parser(name).parse(text)
    assert all(isinstance(e, str) and e for e in outcome.errors)
    assert all(isinstance(c.arguments, dict) for c in outcome.calls)
