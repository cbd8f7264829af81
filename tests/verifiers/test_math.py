"""math_equal: exact number fast path and math-verify (in worker subprocesses) for the rest."""

from __future__ import annotations

from fractions import Fraction

import pytest

from protocol import VerifyRequest
from tools.verifiers import math as math_verifier
from tools.verifiers.math import check_equal, math_equal, plain_number


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    math_verifier.shutdown_pool()


def req(response, truth, **arguments) -> VerifyRequest:
    return VerifyRequest("math_equal", ground_truth=truth, response=response, arguments=arguments)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        (" -3.50 ", Fraction(-7, 2)),
        ("1,234,567", Fraction(1234567)),
        ("$12$", Fraction(12)),
        ("\\boxed{7}", Fraction(7)),
        ("1e3", Fraction(1000)),
        ("1e10000000", None),  # a huge exponent is left to math-verify and its time limits
        ("12.", Fraction(12)),
        ("1/2", None),
        ("12,34", None),
        ("", None),
        ("-", None),
        ("x", None),
        (".", None),
    ],
)
def test_plain_number(text, value):
    assert plain_number(text) == value


class TestFastPath:
    @pytest.mark.parametrize(
        ("response", "truth", "score"),
        [
            ("<answer>1769307</answer>", 1769307, 1.0),
            ("<answer>1,769,307</answer>", 1769307, 1.0),
            ("<answer>1769306</answer>", 1769307, 0.0),
            ("<answer>2.50</answer>", "2.5", 1.0),
            ("<answer>-4</answer>", -4, 1.0),
            ("<answer>3</answer>", ["2", "3"], 1.0),
            ("<answer>12345678901234567890123</answer>", 12345678901234567890123, 1.0),
        ],
    )
    async def test_numbers(self, response, truth, score):
        result = await math_equal(req(response, truth))
        assert result.score == score
        assert result.details["path"] == "number"

    async def test_rel_tol(self):
        assert (await math_equal(req("<answer>3.1416</answer>", 3.14159))).score == 0.0
        assert (await math_equal(req("<answer>3.1416</answer>", 3.14159, rel_tol=1e-4))).score == 1.0


class TestMathVerify:
    @pytest.mark.parametrize(
        ("response", "truth", "score"),
        [
            ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
            ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
            ("<answer>1/2</answer>", "0.5", 1.0),
            ("<answer>x+1</answer>", "1+x", 1.0),
            ("<answer>\\sqrt{2}</answer>", "\\sqrt{2}", 1.0),
            ("<answer>\\sqrt{3}</answer>", "\\sqrt{2}", 0.0),
            ("Thinking... so the result is \\boxed{\\frac{3}{4}}", "0.75", 1.0),
            ("<answer>\\{1, 2\\}</answer>", "\\{2, 1\\}", 1.0),
        ],
    )
    async def test_symbolic(self, response, truth, score):
        result = await math_equal(req(response, truth))
        assert result.score == score, result.details
        assert result.details["path"] == "math_verify"

    async def test_unparseable_answer_scores_zero_with_detail(self):
        result = await math_equal(req("<answer>\\frac{</answer>", "\\frac{1}{2}"))
        assert result.score == 0.0
        assert result.details.get("error") or result.details.get("parsed_answer")

    async def test_words_do_not_equal_numbers(self):
        assert (await math_equal(req("<answer>forty</answer>", 40))).score == 0.0

    async def test_runaway_expression_is_cut_off(self):
        # sympy would try to build 9^(9^(9^9)); math-verify's limits stop it in the worker.
        result = await math_equal(req("<answer>9^9^9^9</answer>", "1", timeout_s=1))
        assert result.score == 0.0

    async def test_worker_survives_many_requests(self):
        for _ in range(3):
            assert (await math_equal(req("<answer>\\frac{2}{4}</answer>", "1/2"))).score == 1.0


class TestEdges:
    async def test_empty_response(self):
        result = await math_equal(req("", 3))
        assert result.score == 0.0
        assert result.details["error"] == "empty answer"

    async def test_missing_ground_truth(self):
        result = await math_equal(req("<answer>3</answer>", None))
        assert result.score == 0.0
        assert "ground_truth" in result.details["error"]

    async def test_require_answer_tag(self):
        result = await math_equal(req("3", 3, require_answer_tag=True))
        assert result.score == 0.0
        assert "tag" in result.details["error"]

    def test_check_equal_in_process_off_main_thread(self):
        # Called directly from a worker thread, math-verify must run without signal limits.
        import threading

        out: dict = {}
        thread = threading.Thread(target=lambda: out.update(check_equal("\\frac{1}{2}", ["0.5"], 5)))
        thread.start()
        thread.join(60)
        assert out["equal"] is True


def test_a_worker_past_its_deadline_is_killed_and_replaced():
    pool = math_verifier._WorkerPool(1)
    request = {"prediction": "\\frac{1}{2}", "golds": ["0.5"], "timeout_s": 5}
    try:
        with pytest.raises(TimeoutError):
            pool.run(request, deadline_s=0.001)  # a fresh worker cannot even start that fast
        assert pool._idle.empty()  # the late worker was not returned to the pool
        assert pool.run(request, deadline_s=60)["equal"] is True  # a new one took its place
    finally:
        pool.close()
