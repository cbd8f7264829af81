"""exact_match and f1: SQuAD-style scoring against one or several golds."""

from __future__ import annotations

import pytest

from protocol import VerifyRequest
from tools.verifiers import BUILTIN_VERIFIERS
from tools.verifiers.match import exact_match, f1, token_f1


def req(response=None, truth=None, messages=None, **arguments) -> VerifyRequest:
    return VerifyRequest(
        "exact_match", ground_truth=truth, response=response, messages=messages, arguments=arguments
    )


class TestExactMatch:
    @pytest.mark.parametrize(
        ("response", "truth", "score"),
        [
            ("<answer>Paris</answer>", "Paris", 1.0),
            ("<answer> the paris. </answer>", "Paris", 1.0),
            ("<answer>Lyon</answer>", "Paris", 0.0),
            ("<answer>Washington DC</answer>", {"target": ["Washington, D.C.", "DC"]}, 1.0),
            ("<answer>DC</answer>", ["Washington, D.C.", "DC"], 1.0),
            ("<answer>680,000</answer>", 680000, 1.0),
            ("<answer>680000</answer>", {"target": ["680000", "680,000"]}, 1.0),
            ("<answer>yes</answer>", True, 1.0),
            ("<answer>No</answer>", False, 1.0),
            ("<answer>2.5</answer>", 2.5, 1.0),
            ("<answer>São Paulo</answer>", "Sao Paulo", 0.0),  # accents are not folded away
            ("<answer>SÃO PAULO</answer>", "São Paulo", 1.0),
            ("Paris", "Paris", 1.0),  # no tag: the whole text is the answer
            ("The answer is Paris", "Paris", 0.0),
        ],
    )
    def test_scores(self, response, truth, score):
        result = exact_match(req(response, truth))
        assert result.score == score
        assert result.components == {"exact_match": score}

    def test_last_answer_tag_wins(self):
        result = exact_match(req("<answer>Lyon</answer> no wait <answer>Paris</answer>", "Paris"))
        assert result.score == 1.0
        assert result.details["answer"] == "Paris"
        assert result.details["matched"] == "Paris"
        assert result.details["tagged"] is True

    def test_first_of_multiple_tags_is_not_used(self):
        assert exact_match(req("<answer>Paris</answer> <answer>Lyon</answer>", "Paris")).score == 0.0

    def test_empty_response(self):
        result = exact_match(req("", "Paris"))
        assert result.score == 0.0
        assert result.details["normalized"] == ""

    def test_empty_answer_never_matches_a_real_gold(self):
        assert exact_match(req("<answer></answer>", "Paris")).score == 0.0

    def test_require_answer_tag(self):
        result = exact_match(req("Paris", "Paris", require_answer_tag=True))
        assert result.score == 0.0
        assert "no <answer> tag" in result.details["error"]

    def test_messages_last_assistant_turn(self):
        messages = [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "<search>France capital</search>"},
            {"role": "tool", "content": "Paris is the capital."},
            {"role": "assistant", "content": "<answer>Paris</answer>"},
        ]
        assert exact_match(req(messages=messages, truth="Paris")).score == 1.0

    def test_bad_ground_truth_scores_zero_with_reason(self):
        result = exact_match(req("<answer>x</answer>", None))
        assert result.score == 0.0
        assert "ground_truth is missing" in result.details["error"]
        assert result.components == {"exact_match": 0.0}

    def test_registered(self):
        assert BUILTIN_VERIFIERS["exact_match"] is exact_match


class TestF1:
    def test_partial_overlap(self):
        result = f1(req("<answer>The capital is Washington DC</answer>", "Washington, D.C."))
        # prediction tokens: capital is washington dc (4); gold: washington dc (2); overlap 2
        assert result.components["precision"] == pytest.approx(0.5)
        assert result.components["recall"] == pytest.approx(1.0)
        assert result.score == pytest.approx(2 / 3)

    def test_max_over_golds(self):
        result = f1(req("<answer>Barack Obama</answer>", ["George Bush", "Obama"]))
        assert result.score == pytest.approx(2 / 3)
        assert result.details["best_gold"] == "Obama"

    def test_exact_is_one_and_disjoint_is_zero(self):
        assert f1(req("<answer>red fox</answer>", "Red fox!")).score == 1.0
        assert f1(req("<answer>blue whale</answer>", "red fox")).score == 0.0

    def test_repeated_tokens_count_once_per_occurrence(self):
        # SQuAD counts overlap with multiplicity: "a a b" vs "a b" -> overlap 2 of 3 predicted
        assert token_f1(["x", "x", "y"], ["x", "y"]) == pytest.approx((0.8, 2 / 3, 1.0))

    def test_empty_cases(self):
        assert token_f1([], []) == (1.0, 1.0, 1.0)
        assert token_f1([], ["a"]) == (0.0, 0.0, 0.0)
        assert f1(req("", "Paris")).score == 0.0
        assert f1(req("<answer>the</answer>", "a")).score == 1.0  # both normalise to nothing

    def test_numbers_vs_strings(self):
        assert f1(req("<answer>1,234</answer>", 1234)).score == 1.0

    def test_bad_ground_truth(self):
        result = f1(req("<answer>x</answer>", {"wrong_key": "x"}))
        assert result.score == 0.0
        assert result.components == {"f1": 0.0, "precision": 0.0, "recall": 0.0}
        assert "target" in result.details["error"]
