"""Tool-call parsers: formats, error messages the model sees, and robustness on any text."""

from __future__ import annotations

import json
import keyword
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_client.parsers.registry import (
    MAX_NESTING,
    HermesParser,
    ParsedCall,
    ParseOutcome,
    ToolCallParser,
    check_call,
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
    assert parser.parse("[see above]").errors == []  # not a call list: an ordinary reply
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

# A Python keyword cannot name a pythonic call or argument ("[as()]", "[f(if=1)]": syntax errors).
_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))
_identifiers = st.from_regex(r"[a-z_]{1,8}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(_identifiers, _json_values, max_size=4)


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


def assert_well_formed(outcome: ParseOutcome) -> None:
    """What the rollout relies on: calls that encode as JSON, errors the model can read."""
    for call in outcome.calls:
        assert isinstance(call.name, str) and call.name.strip()
        call.name.encode("utf-8")
        orjson.dumps(call.arguments)  # what the client sends; raises on sets, surrogates, ...
        json.dumps(call.arguments, allow_nan=False)  # orjson would silently send NaN as null
    for error in outcome.errors:
        assert isinstance(error, str) and error
        error.encode("utf-8")  # shown to the model through the tokenizer


# --------------------------------------------------------------------------- arguments that are not JSON


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("pythonic", "[calculator(expression={'1+1'})]", "a set is not JSON; use a list"),
        ("pythonic", "[calculator(expression=b'1+1')]", "bytes are not JSON; use a string"),
        ("pythonic", "[calculator(expression=1j)]", "a complex is not a JSON value"),
        ("pythonic", "[calculator(expression=...)]", "... is not a JSON value"),
        ("pythonic", "[calculator(expression=1e999)]", "inf is not a JSON number"),
        ("pythonic", "[calculator(expression={1: 'x'})]", "object keys must be strings, got int"),
        ("pythonic", f"[calculator(expression={2**64})]", "the integer does not fit in 64 bits"),
        ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "\\ud83d"}}</tool_call>',
         "the string holds a lone surrogate (not valid UTF-8)"),
        ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": NaN}}</tool_call>',
         "nan is not a JSON number"),
        ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": -Infinity}}</tool_call>',
         "-inf is not a JSON number"),
        ("hermes", "<tool_call>{'name': 'calculator', 'arguments': {'expression': {'1+1'}}}</tool_call>",
         "a set is not JSON; use a list"),
        ("llama3_json", '{"name": "calculator", "parameters": {"expression": "\\udc00"}}',
         "the string holds a lone surrogate (not valid UTF-8)"),
    ],
)  # fmt: skip
def test_arguments_that_cannot_travel_as_json_are_that_calls_parse_error(
    name: str, text: str, reason: str
) -> None:
    outcome = get_parser(name).parse(text)
    assert outcome.calls == []
    assert outcome.errors == [f"calculator: argument expression cannot be sent as JSON: {reason}"]
    assert_well_formed(outcome)


def test_a_bad_call_does_not_take_its_neighbours_with_it() -> None:
    outcome = get_parser("pythonic").parse("[calculator(expression={'1+1'}), calculator(expression='2+3')]")
    assert outcome.calls == [ParsedCall("calculator", {"expression": "2+3"})]
    assert len(outcome.errors) == 1 and "a set is not JSON" in outcome.errors[0]
    hermes = get_parser("hermes", parallel_calls=True).parse(
        '<tool_call>{"name": "a", "arguments": {"x": "\\ud83d"}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {"x": "ok"}}</tool_call>'
    )
    assert hermes.calls == [ParsedCall("b", {"x": "ok"})] and len(hermes.errors) == 1


def test_check_call_normalises_and_names_the_problem() -> None:
    assert check_call(ParsedCall("f", {"a": (1, (2, 3))})) == ParsedCall("f", {"a": [1, [2, 3]]})
    assert check_call(ParsedCall("f\ud800", {})) == (
        "the tool name 'f\\ud800' holds a lone surrogate (not valid UTF-8)"
    )
    deep: Any = []
    for _ in range(MAX_NESTING + 5):
        deep = [deep]
    too_deep = check_call(ParsedCall("f", {"a": deep}))
    assert isinstance(too_deep, str) and too_deep.startswith("f: argument a[0][0][0]")
    assert too_deep.endswith(f"... cannot be sent as JSON: nested deeper than {MAX_NESTING} levels")
    assert check_call(ParsedCall("f", {"a": [1, {"b": float("nan")}]})) == (
        "f: argument a[1]['b'] cannot be sent as JSON: nan is not a JSON number"
    )


# --------------------------------------------------------------------------- deep input


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "<tool_call>" + "[" * 1000 + "</tool_call>"),
        ("hermes", "<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>"),
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 1000),  # truncated
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 1000 + "</tool_call>"),
        ("hermes", '<tool_call>{"name": "f", "arguments": "' + "[" * 1000 + '"}</tool_call>'),
        ("hermes", "<tool_call>{'name': 'f', 'arguments': {'a': " + "-" * 3000 + "1}}</tool_call>"),
        ("llama3_json", '[{"name": "f", "parameters": ' + "[" * 1000),
        ("llama3_json", "[" + "{" * 1000),
        ("llama3_json", '{"name": "f", "parameters": {"a": ' + "[" * 1000 + "]" * 1000 + "}}"),
        ("pythonic", "[f(a=" + "-" * 3000 + "1)]"),
        ("pythonic", "[f(a=" + "not " * 3000 + "x)]"),
        ("pythonic", "[" + "a." * 1000 + "b(x=1)]"),
        ("pythonic", "[f(a=" + "[" * 1000 + "]" * 1000 + ")]"),
        ("pythonic", "[f(a=" + "(" * 1000 + "1" + ")" * 1000 + ")]"),
        ("pythonic", "[f(a=" + "9" * 5000 + ")]"),
        ("pythonic", "[f(a='\ud83d')]"),
    ],
)
def test_deep_or_huge_input_is_a_parse_error_not_an_exception(name: str, text: str) -> None:
    outcome = get_parser(name).parse(text)
    assert outcome.calls == []
    assert len(outcome.errors) >= 1
    assert_well_formed(outcome)


def test_nesting_up_to_the_limit_still_parses() -> None:
    value: Any = 1
    for _ in range(MAX_NESTING - 5):
        value = [value]
    text = f"<tool_call>{json.dumps({'name': 'f', 'arguments': {'a': value}})}</tool_call>"
    assert get_parser("hermes").parse(text).calls == [ParsedCall("f", {"a": value})]
    pythonic = get_parser("pythonic").parse(f"[f(a={value!r})]")
    assert pythonic.calls == [ParsedCall("f", {"a": value})]


# --------------------------------------------------------------------------- silent non-parses


def test_pythonic_reports_an_unclosed_or_cut_call_list_as_hermes_does() -> None:
    parser = get_parser("pythonic")
    unclosed = (
        "the call list was opened with [ but not closed with ] at the end of the turn; "
        'expected [tool_name(arg="value", ...)] with literal arguments'
    )
    for text in (
        '[get_weather(city="Paris")',
        '[get_weather(city="Paris"), add(a=1, b=',
        "[f(a=1)] and then",
    ):
        outcome = parser.parse(text)
        assert (outcome.calls, outcome.errors) == ([], [unclosed]), text
    cut = parser.parse('[get_weather(city="Par]')
    assert cut.calls == [] and cut.errors[0].startswith("invalid call list: ")
    for text in ("[see above]", "[1, 2, 3]", "Sure: [f(a=1)]", "[Paris"):
        assert (parser.parse(text).calls, parser.parse(text).errors) == ([], []), text


def test_llama3_json_parses_a_json_array_of_calls() -> None:
    parser = get_parser("llama3_json")
    text = (
        '<|python_tag|>[{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "now", "parameters": {}}]'
    )
    outcome = parser.parse(text)
    assert outcome.calls == [ParsedCall("add", {"a": 1, "b": 2}), ParsedCall("now", {})]
    assert outcome.errors == []
    mixed = parser.parse('[{"name": "add", "parameters": {"a": 1}}, {"parameters": {}}]')
    assert mixed.calls == [ParsedCall("add", {"a": 1})]
    assert mixed.errors == [
        'the tool call has no tool name: "name" must be a non-empty string; '
        'expected {"name": ..., "parameters": {...}}'
    ]
    cut = parser.parse('[{"name": "add", "parameters": {"a": 1}}, {"name": "n')
    assert cut.calls == [] and cut.errors[0].startswith("invalid JSON in the list of tool calls: ")
    assert parser.parse("[1, 2, 3]").errors == []  # a plain list is an ordinary reply


def test_hermes_reads_a_python_dict_with_true_and_none() -> None:
    parser = get_parser("hermes")
    outcome = parser.parse(
        "<tool_call>{'name': 'search', 'arguments': {'query': \"it's\", 'exact': True, 'limit': None}}</tool_call>"
    )
    assert outcome.calls == [ParsedCall("search", {"query": "it's", "exact": True, "limit": None})]
    mixed = parser.parse('<tool_call>{"name": "f", "arguments": {"ok": False}}</tool_call>')
    assert mixed.calls == [ParsedCall("f", {"ok": False})]
    evil = parser.parse("<tool_call>{'name': 'f', 'arguments': __import__('os').getcwd()}</tool_call>")
    assert evil.calls == [] and evil.errors[0].startswith("invalid JSON in <tool_call>: ")


CD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "cd",
        "description": "Change directory.",
        "parameters": {
            "type": "object",
            "properties": {"folder": {"type": "string"}},
            "required": ["folder"],
        },
    },
}
MV_DESCRIPTOR = {  # an MCP descriptor, as /v1/tools returns it
    "name": "mv",
    "inputSchema": {"type": "object", "properties": {"source": {}, "destination": {}}},
}


def test_pythonic_positional_arguments_follow_the_schema_order() -> None:
    parser = get_parser("pythonic")
    tools = [CD_SCHEMA, MV_DESCRIPTOR]
    outcome = parser.parse("[cd('archives'), mv('a.txt', destination='b.txt')]", tools=tools)
    assert outcome.calls == [
        ParsedCall("cd", {"folder": "archives"}),
        ParsedCall("mv", {"source": "a.txt", "destination": "b.txt"}),
    ]
    assert outcome.errors == []
    too_many = parser.parse("[cd('a', 'b')]", tools=tools)
    assert too_many.errors[0].startswith("cd(...) takes at most 1 positional arguments (folder), got 2")
    twice = parser.parse("[cd('a', folder='b')]", tools=tools)
    assert twice.errors[0].startswith("cd(...) gives argument folder twice")
    unknown = parser.parse("[ls('a')]", tools=tools)  # no schema for ls: the clear error, as before
    assert unknown.errors[0].startswith("ls(...) uses positional arguments; pass every argument by keyword")
    assert parser.parse("[cd('a')]").errors[0].startswith("cd(...) uses positional arguments")


# --------------------------------------------------------------------------- never raise, any string

_ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=200)
_FORMATS = st.sampled_from(["hermes", "search_r1", "llama3_json", "pythonic"])


@settings(max_examples=300, deadline=None)
@given(_ANY_TEXT, _FORMATS)
def test_parsers_never_raise_on_arbitrary_text(text: str, name: str) -> None:
    assert_well_formed(get_parser(name).parse(text))


def _valid_turn(name: str, tool: str, arguments: dict[str, Any]) -> str:
    if name == "hermes":
        return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"
    if name == "llama3_json":
        return json.dumps([{"name": tool, "parameters": arguments}])
    if name == "pythonic":
        return f"[{tool}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})]"
    return f"<search>{arguments}</search>"


_NASTY = [
    "[" * 1000, "{" * 1000, "(" * 300, "-" * 3000, "not " * 3000, "a." * 1000, "9" * 5000,
    "\ud83d", "{'1+1'}", "NaN", "Infinity", "1e999", "b'x'", "1j", "...", "True", "None",
    "'", '"', "\\", "]", ")", "}", ",", "=", "<tool_call>", "</tool_call>", "<|python_tag|>", "```",
]  # fmt: skip
_mutation = st.tuples(
    st.booleans(),
    st.integers(0, 10_000),
    st.integers(0, 8),
    st.sampled_from(_NASTY) | st.text(alphabet=st.characters(exclude_categories=()), max_size=8),
)


def _mutate(text: str, at_structure: bool, position: int, deleted: int, inserted: str) -> str:
    """Replace ``deleted`` characters with ``inserted``: anywhere, or right after a
    character where a value starts (``=``, ``:``, ``[``, ...), where nesting does harm."""
    places = [i + 1 for i, ch in enumerate(text) if ch in "=:[{(, "] if at_structure else []
    at = places[position % len(places)] if places else position % (len(text) + 1)
    return text[:at] + inserted + text[at + deleted :]


@settings(max_examples=300, deadline=None)
@given(_FORMATS, _names, _arguments, st.lists(_mutation, min_size=1, max_size=3), st.integers(0, 10_000))
def test_parsers_never_raise_on_mutated_valid_output(
    name: str, tool: str, arguments: dict[str, Any], mutations: list[tuple[bool, int, int, str]], cut: int
) -> None:
    text = _valid_turn(name, tool, arguments)
    for mutation in mutations:
        text = _mutate(text, *mutation)
    assert_well_formed(get_parser(name).parse(text))
    assert_well_formed(get_parser(name).parse(text[: cut % (len(text) + 1)]))


@settings(max_examples=100, deadline=None)
@given(_names, _arguments)
def test_valid_calls_round_trip_in_every_function_call_format(tool: str, arguments: dict[str, Any]) -> None:
    for name in ("hermes", "llama3_json", "pythonic"):
        outcome = get_parser(name).parse(_valid_turn(name, tool, arguments))
        assert (outcome.calls, outcome.errors) == ([ParsedCall(tool, arguments)], []), name
        assert not any(isinstance(v, float) and math.isnan(v) for v in arguments.values())
