"""weighted: combinations of built-in verifiers with per-verifier options."""

from __future__ import annotations

import pytest

from protocol import Result, VerifyRequest
from tools.verifiers import BUILTIN_VERIFIERS
from tools.verifiers.weighted import weighted


class GraderContext:
    """Stands in for the server's ToolContext: the llm tool always answers Score: 6."""

    session = None
    call_id = "c"

    def __init__(self) -> None:
        self.names: list[str] = []

    async def call(self, name, arguments):
        self.names.append(name)
        return Result("inner", [{"type": "text", "text": "Score: 6"}])


def req(response, truth="Paris", **arguments) -> VerifyRequest:
    return VerifyRequest("weighted", ground_truth=truth, response=response, arguments=arguments)


async def test_exact_match_plus_format():
    arguments = {"verifiers": {"exact_match": 0.8, "format": 0.2}, "arguments": {"format": {"max_calls": 0}}}
    result = await weighted(req("<think>easy</think><answer>Paris</answer>", **arguments))
    assert result.score == pytest.approx(1.0)
    assert result.components["exact_match"] == 1.0
    assert result.components["format"] == 1.0
    assert result.components["format.single_answer"] == 1.0
    assert result.details["weights"] == {"exact_match": 0.8, "format": 0.2}
    assert result.details["exact_match"]["answer"] == "Paris"


async def test_partial_credit_for_format_only():
    arguments = {"verifiers": {"exact_match": 0.8, "format": 0.2}}
    result = await weighted(req("<think>hmm</think><answer>Lyon</answer>", **arguments))
    assert result.score == pytest.approx(0.2)


async def test_per_verifier_arguments_reach_their_verifier():
    arguments = {
        "verifiers": {"format": 1.0},
        "arguments": {"format": {"min_calls": 1}},
    }
    result = await weighted(req("<answer>Paris</answer>", **arguments))
    assert result.components["format.tool_call_count"] == 0.0


async def test_normalize():
    arguments = {"verifiers": {"exact_match": 2.0, "f1": 2.0}, "normalize": True}
    result = await weighted(req("<answer>Paris France</answer>", **arguments))
    assert result.components["exact_match"] == 0.0
    assert result.components["f1"] == pytest.approx(2 / 3)
    assert result.score == pytest.approx(1 / 3)


async def test_ctx_is_passed_to_the_judge():
    ctx = GraderContext()
    arguments = {"verifiers": {"judge": 0.5, "exact_match": 0.5}}
    result = await weighted(req("<answer>Paris</answer>", **arguments), ctx)
    assert ctx.names == ["llm"]
    assert result.components["judge"] == pytest.approx(0.6)
    assert result.score == pytest.approx(0.8)


async def test_async_and_sync_verifiers_mix():
    arguments = {"verifiers": {"math_equal": 1.0, "exact_match": 1.0}}
    result = await weighted(req("<answer>1,234</answer>", truth=1234, **arguments))
    assert result.score == 2.0


async def test_a_raising_verifier_scores_zero_without_losing_the_rest(monkeypatch):
    def broken(request):
        raise RuntimeError("bug in a custom verifier")

    monkeypatch.setitem(BUILTIN_VERIFIERS, "broken", broken)
    result = await weighted(req("<answer>Paris</answer>", verifiers={"broken": 0.5, "exact_match": 0.5}))
    assert result.score == 0.5
    assert result.components["broken"] == 0.0
    assert "bug in a custom verifier" in result.details["broken"]["error"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "needs arguments.verifiers"),
        ({"verifiers": {}}, "needs arguments.verifiers"),
        ({"verifiers": {"nope": 1}}, "unknown verifier 'nope'"),
        ({"verifiers": {"weighted": 1}}, "cannot contain itself"),
        ({"verifiers": {"exact_match": "1"}}, "must be a number"),
        ({"verifiers": {"exact_match": 1}, "arguments": {"exact_match": 3}}, "option objects"),
    ],
)
async def test_bad_options(arguments, message):
    result = await weighted(req("<answer>Paris</answer>", **arguments))
    assert result.score == 0.0
    assert message in result.details["error"]


def test_table_lists_every_verifier_with_its_name():
    from protocol import get_tool_meta

    assert set(BUILTIN_VERIFIERS) >= {
        "exact_match",
        "f1",
        "math_equal",
        "code_tests",
        "sql_match",
        "judge",
        "format",
        "weighted",
    }
    for name, fn in BUILTIN_VERIFIERS.items():
        if name == "broken":
            continue
        meta = get_tool_meta(fn)
        assert meta.name == name and meta.kind == "verifier"
