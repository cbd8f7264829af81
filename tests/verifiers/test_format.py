"""format: tag balance, one final answer, tool-call JSON and call-count penalties."""

from __future__ import annotations

from dataclasses import replace

import pytest

from protocol import VerifyRequest
from tools.verifiers.format import format_check, tag_problem, tool_call_problem

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 3"}}\n</tool_call>'


def req(response=None, messages=None, **arguments) -> VerifyRequest:
    return VerifyRequest("format", response=response, messages=messages, arguments=arguments)


def trajectory(*assistant_turns: str) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "q"}]
    for turn in assistant_turns:
        messages.append({"role": "assistant", "content": turn})
        messages.append({"role": "tool", "content": "6"})
    return messages[:-1]


class TestTagProblem:
    @pytest.mark.parametrize(
        "text",
        ["", "plain", "<think>a</think><answer>b</answer>", "<think><search>x</search></think>", "<unknown>"],
    )
    def test_well_formed(self, text):
        assert tag_problem(text) is None

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("<think>a", "<think> is never closed"),
            ("a</think>", "</think> without an opening tag"),
            ("<think><answer></think></answer>", "</think> closes while <answer> is still open"),
            ("<answer><answer>x</answer></answer>", "<answer> opened inside another <answer>"),
        ],
    )
    def test_broken(self, text, problem):
        assert tag_problem(text) == problem


class TestToolCallProblem:
    def test_valid(self):
        assert tool_call_problem('{"name": "calculator", "arguments": {"expression": "1"}}') is None
        assert tool_call_problem('{"name": "now"}') is None  # arguments may be omitted

    @pytest.mark.parametrize(
        ("body", "problem"),
        [
            ("{name: calculator}", "not valid JSON"),
            ("[1, 2]", "must be a JSON object"),
            ('{"arguments": {}}', 'non-empty string "name"'),
            ('{"name": "x", "arguments": "2*3"}', '"arguments" must be an object'),
        ],
    )
    def test_invalid(self, body, problem):
        assert problem in tool_call_problem(body)


class TestFormatVerifier:
    def test_perfect_trajectory(self):
        result = format_check(
            req(messages=trajectory(f"<think>use the tool</think>{CALL}", "<answer>6</answer>"))
        )
        assert result.score == 1.0
        assert result.components == {
            "tags_balanced": 1.0,
            "single_answer": 1.0,
            "tool_call_json": 1.0,
            "tool_call_count": 1.0,
        }
        assert result.details["tool_calls"] == 1
        assert result.details["problems"] == []

    def test_calls_in_worked_examples_do_not_count(self):
        # A few-shot prompt shows four calls and three answers; the rollout makes none.
        examples = trajectory(CALL, "<answer>6</answer>") * 2 + trajectory(CALL, CALL, "<answer>6</answer>")
        prompt = [*examples, {"role": "user", "content": "What is 7 * 8?"}]
        no_call = [*prompt, {"role": "assistant", "content": "<answer>56</answer>"}]
        one_call = [
            *prompt,
            {"role": "assistant", "content": CALL},
            {"role": "tool", "content": "56"},
            {"role": "assistant", "content": "<answer>56</answer>"},
        ]
        start = len(prompt)
        scored = format_check(replace(req(messages=one_call, min_calls=1, max_calls=4), response_start=start))
        assert scored.score == 1.0 and scored.details["tool_calls"] == 1
        lazy = format_check(replace(req(messages=no_call, min_calls=1, max_calls=4), response_start=start))
        assert lazy.details["tool_calls"] == 0 and lazy.components["tool_call_count"] < 1.0
        assert lazy.score < scored.score
        # Read as the model's own (response_start 0), the examples would hide the difference.
        assert format_check(req(messages=no_call, min_calls=1, max_calls=4)).details["tool_calls"] == 4

    def test_response_only(self):
        assert format_check(req("<think>x</think><answer>y</answer>")).score == 1.0

    def test_no_answer(self):
        result = format_check(req("<think>x</think> I give up"))
        assert result.components["single_answer"] == 0.0
        assert result.score == pytest.approx(0.75)
        assert "0 <answer> blocks" in result.details["problems"][0]

    def test_answer_not_required(self):
        assert format_check(req("no answer here", require_answer=False)).score == 1.0

    def test_two_answers(self):
        result = format_check(req("<answer>1</answer><answer>2</answer>"))
        assert result.components["single_answer"] == 0.0

    def test_answer_before_the_last_turn(self):
        result = format_check(req(messages=trajectory("<answer>6</answer>", "more text")))
        assert result.components["single_answer"] == 0.0

    def test_unclosed_answer(self):
        result = format_check(req("<answer>6"))
        assert result.components["single_answer"] == 0.0
        assert result.components["tags_balanced"] == 0.0

    def test_unbalanced_turn_counts_per_turn(self):
        result = format_check(req(messages=trajectory(f"<think>{CALL}", "<answer>6</answer>")))
        assert result.components["tags_balanced"] == 0.5
        assert result.details["problems"][0].startswith("turn 0:")

    def test_bad_tool_call_json(self):
        bad = "<tool_call>{'name': 'calculator'}</tool_call>"
        result = format_check(req(messages=trajectory(CALL, bad, "<answer>6</answer>")))
        assert result.components["tool_call_json"] == 0.5
        assert result.details["tool_calls"] == 2

    def test_call_count_limits(self):
        messages = trajectory(CALL, CALL, CALL, "<answer>6</answer>")
        assert format_check(req(messages=messages, max_calls=3)).components["tool_call_count"] == 1.0
        assert format_check(req(messages=messages, max_calls=2)).components["tool_call_count"] == 0.0
        soft = format_check(req(messages=messages, max_calls=1, call_penalty=0.25))
        assert soft.components["tool_call_count"] == pytest.approx(0.5)
        too_few = format_check(req("<answer>6</answer>", min_calls=1))
        assert too_few.components["tool_call_count"] == 0.0
        assert "0 tool calls, expected between 1 and any number" in too_few.details["problems"][0]

    def test_search_tags_and_structured_tool_calls_count(self):
        messages = [
            {"role": "assistant", "content": "<search>a</search>"},
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}, {"id": "2"}]},
            {"role": "assistant", "content": "<answer>x</answer>"},
        ]
        assert format_check(req(messages=messages)).details["tool_calls"] == 3

    def test_weights(self):
        result = format_check(req("no answer", weights={"single_answer": 3.0}))
        assert result.score == pytest.approx(3 / 6)

    def test_empty_output(self):
        result = format_check(req(messages=[{"role": "user", "content": "q"}]))
        assert result.components["tags_balanced"] == 0.0
        assert "no assistant output" in result.details["problems"]

    @pytest.mark.parametrize(
        ("arguments", "message"),
        [
            ({"weights": {"nope": 1}}, "unknown format weights"),
            ({"max_calls": "three"}, '"max_calls" must be a number'),
            ({"tags": "think"}, '"tags" must be a list'),
            ({"weights": {"single_answer": "x"}}, '"single_answer" must be a number'),
        ],
    )
    def test_bad_options_say_which(self, arguments, message):
        result = format_check(req("<answer>x</answer>", **arguments))
        assert result.score == 0.0
        assert message in result.details["error"]

    def test_custom_tags(self):
        assert (
            format_check(req("<answer>x</answer><code>", tags=["answer", "code"])).components["tags_balanced"]
            == 0.0
        )
