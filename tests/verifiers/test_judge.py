"""judge: score parsing, prompt building, and the fallback when the grader fails.

The grader call goes through ``ctx.call``; here a tiny stand-in context records the
request and returns a canned protocol.Result (the unit boundary of this verifier; the
end-to-end run against a real small model lives with the llm tool's tests).
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol import ErrorKind, Result, VerifyRequest
from tools.verifiers.judge import DEFAULT_RUBRIC, JudgeParseError, judge, parse_judge_score


class FakeContext:
    """Implements ToolContext.call: returns ``reply`` (text or Result) or raises ``error``."""

    session = None
    call_id = "c-1"

    def __init__(self, reply: str | Result | None = None, error: Exception | None = None) -> None:
        self.reply = reply
        self.error = error
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        self.calls.append((name, arguments))
        if self.error is not None:
            raise self.error
        if isinstance(self.reply, Result):
            return self.reply
        return Result("inner", [{"type": "text", "text": self.reply or ""}])


def req(response="<answer>Paris</answer>", truth="Paris", messages=None, **arguments) -> VerifyRequest:
    if messages is None:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
    return VerifyRequest(
        "judge", ground_truth=truth, response=response, messages=messages, arguments=arguments
    )


class TestParse:
    @pytest.mark.parametrize(
        ("text", "lo", "hi", "score"),
        [
            ("Score: 7/10", 0, 10, 0.7),
            ("7", 0, 10, 0.7),
            ("  8. ", 0, 10, 0.8),
            ("**7**", 0, 10, 0.7),
            ("0.7", 0, 1, 0.7),
            ("[[8]]", 0, 10, 0.8),
            ("[[ 3 / 5 ]]", 0, 10, 0.6),
            ("The answer is right.\nRating: **4**", 1, 5, 0.75),
            ("**Score:** 9", 0, 10, 0.9),
            ("score of 3 out of 5", 0, 10, 0.6),
            ("I give it 8/10.", 0, 10, 0.8),
            ("Score: 7/10", 1, 10, 6 / 9),  # denominator equals hi: the range applies
            ("Verdict - 6", 0, 10, 0.6),
            ("score is 4", 0, 10, 0.4),
            ("Score: -3", -5, 5, 0.2),
            ("SCORE=10", 0, 10, 1.0),
            ("Score: 0", 0, 10, 0.0),
        ],
    )
    def test_scores(self, text, lo, hi, score):
        assert parse_judge_score(text, lo, hi) == pytest.approx(score)

    def test_last_verdict_wins(self):
        assert parse_judge_score("At first Score: 2, but on reflection Score: 9", 0, 10) == pytest.approx(0.9)

    def test_bracketed_verdict_beats_prose(self):
        assert parse_judge_score("[[2]] although the score could be 5", 0, 10) == pytest.approx(0.2)

    def test_steps_numbered_in_prose_are_not_scores(self):
        with pytest.raises(JudgeParseError, match="no score found"):
            parse_judge_score("The response lists 3 cities and 2 rivers.", 0, 10)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("Score: 15", "outside the range"),
            ("Score: 7/5", "not a fraction"),
            ("Score: 1/0", "not a fraction"),
            ("no idea", "no score found"),
            ("", "no score found"),
        ],
    )
    def test_unreadable(self, text, message):
        with pytest.raises(JudgeParseError, match=message):
            parse_judge_score(text, 0, 10)

    def test_empty_range(self):
        with pytest.raises(JudgeParseError, match="empty"):
            parse_judge_score("5", 5, 5)


class TestJudge:
    async def test_scores_and_builds_the_prompt(self):
        ctx = FakeContext("The response names Paris, matching the reference.\nScore: 10")
        result = await judge(req(), ctx)
        assert result.score == 1.0
        assert result.components == {"judge": 1.0}
        assert "judge_error" not in result.details
        ((name, call),) = ctx.calls
        assert name == "llm"
        assert call["temperature"] == 0 and call["max_tokens"] == 512
        system, user = call["messages"]
        assert system["role"] == "system" and user["role"] == "user"
        text = user["content"]
        assert DEFAULT_RUBRIC.replace("{lo}", "0").replace("{hi}", "10") in text
        assert "What is the capital of France?" in text
        assert "<answer>Paris</answer>" in text
        assert "Reference answer:\nParis" in text
        assert "'Score: N', where N is a number from 0 to 10" in text

    async def test_options(self):
        ctx = FakeContext("Rating: 4")
        arguments = {
            "rubric": "Is it polite? {hi} = very polite, {lo} = rude.",
            "score_range": [1, 5],
            "question": "Greet me",
            "answer_only": True,
            "model": "grader-7b",
            "max_tokens": 64,
            "llm_tool": "judge_llm",
        }
        result = await judge(
            req(response="<think>hm</think><answer>Hello!</answer>", truth=None, **arguments), ctx
        )
        assert result.score == pytest.approx(0.75)
        ((name, call),) = ctx.calls
        assert name == "judge_llm" and call["model"] == "grader-7b" and call["max_tokens"] == 64
        text = call["messages"][1]["content"]
        assert "Is it polite? 5 = very polite, 1 = rude." in text
        assert "Greet me" in text
        assert "<response>\nHello!\n</response>" in text
        assert "Reference answer" not in text

    async def test_list_reference(self):
        ctx = FakeContext("[[7]]")
        await judge(req(truth={"target": ["DC", "Washington"]}), ctx)
        assert "Reference answer:\nDC | Washington" in ctx.calls[0][1]["messages"][1]["content"]


class TestFallback:
    async def test_tool_error_result(self):
        failure = Result.failure("inner", ErrorKind.UNAVAILABLE, "endpoint down")
        result = await judge(req(fallback_score=0.5), FakeContext(failure))
        assert result.score == 0.5
        assert result.components == {"judge": 0.5}
        assert "endpoint down" in result.details["judge_error"]

    async def test_call_raises(self):
        result = await judge(req(), FakeContext(error=TimeoutError("slow")))
        assert result.score == 0.0
        assert "TimeoutError" in result.details["judge_error"]

    async def test_unparseable_reply(self):
        result = await judge(req(fallback_score=0.25), FakeContext("I cannot decide."))
        assert result.score == 0.25
        assert "no score found" in result.details["judge_error"]
        assert result.details["judge_output"] == "I cannot decide."

    async def test_out_of_range_reply(self):
        result = await judge(req(), FakeContext("Score: 11"))
        assert result.score == 0.0
        assert "outside the range" in result.details["judge_error"]

    async def test_no_context(self):
        result = await judge(req(), None)
        assert result.score == 0.0
        assert "no tool context" in result.details["judge_error"]

    async def test_bad_score_range(self):
        ctx = FakeContext("Score: 5")
        result = await judge(req(score_range=[10, 0]), ctx)
        assert "score_range" in result.details["judge_error"]
        assert ctx.calls == []

    async def test_fallback_score_is_clamped(self):
        assert (await judge(req(fallback_score=3), None)).score == 1.0
        assert (await judge(req(fallback_score="bad"), None)).score == 0.0
