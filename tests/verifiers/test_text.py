"""Answer extraction, SQuAD normalisation and ground-truth shapes shared by all verifiers."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from protocol import VerifyRequest
from tools.verifiers.text import (
    GroundTruthError,
    assistant_texts,
    extract_answer,
    extract_code,
    final_text,
    format_number,
    gold_answers,
    normalize_answer,
    question_text,
)


def req(**kwargs) -> VerifyRequest:
    return VerifyRequest(verifier="x", **kwargs)


class TestFinalText:
    def test_response_wins_over_messages(self):
        r = req(response="final", messages=[{"role": "assistant", "content": "earlier"}])
        assert final_text(r) == "final"

    def test_last_assistant_message(self):
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "first"},
            {"role": "tool", "content": "obs"},
            {"role": "assistant", "content": "second"},
            {"role": "user", "content": "thanks"},
        ]
        assert final_text(req(messages=messages)) == "second"

    def test_block_list_content(self):
        content = [{"type": "text", "text": "<answer>"}, {"type": "text", "text": "42</answer>"}]
        assert final_text(req(messages=[{"role": "assistant", "content": content}])) == "<answer>42</answer>"

    def test_no_assistant_message_is_empty(self):
        assert final_text(req(messages=[{"role": "user", "content": "q"}])) == ""
        assert final_text(req(messages=[])) == ""

    def test_worked_examples_in_the_prompt_are_not_the_models(self):
        messages = [
            {"role": "user", "content": "example question"},
            {"role": "assistant", "content": "<answer>example answer</answer>"},
            {"role": "user", "content": "the question"},
        ]
        r = req(messages=messages, response_start=3)
        assert final_text(r) == "" and assistant_texts(r) == []
        r = req(messages=[*messages, {"role": "assistant", "content": "mine"}], response_start=3)
        assert final_text(r) == "mine" and assistant_texts(r) == ["mine"]
        assert question_text(r) == "the question"
        # Without response_start the whole chat is the model's, and the question is the first.
        assert question_text(req(messages=messages)) == "example question"
        assert assistant_texts(req(messages=messages)) == ["<answer>example answer</answer>"]

    def test_assistant_texts_does_not_repeat_the_response(self):
        messages = [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
        assert assistant_texts(req(messages=messages, response="b")) == ["a", "b"]
        assert assistant_texts(req(messages=messages, response="c")) == ["a", "b", "c"]


class TestExtractAnswer:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("<answer>Paris</answer>", ("Paris", True)),
            ("<answer> a </answer> then <answer> b </answer>", ("b", True)),
            ("reasoning <answer>  open to the end  ", ("open to the end", True)),
            ("no tags at all  ", ("no tags at all", False)),
            ("", ("", False)),
            ("<answer></answer>", ("", True)),
            ("<answer>x</answer> trailing words", ("x", True)),
        ],
    )
    def test_cases(self, text, expected):
        assert extract_answer(text) == expected

    def test_unstripped(self):
        assert extract_answer("<answer>\n    return 1\n</answer>", strip=False) == ("\n    return 1\n", True)


class TestExtractCode:
    def test_last_python_block(self):
        text = "```python\nfirst()\n```\nand\n```py\nsecond()\n```"
        assert extract_code(text) == "second()"

    def test_other_languages_are_ignored(self):
        assert extract_code("```bash\nls\n```\n```python\nok()\n```\n```text\nnope\n```") == "ok()"

    def test_unterminated_fence(self):
        assert extract_code("```python\nx = 1\ny = 2") == "x = 1\ny = 2"

    def test_no_fence_keeps_indentation(self):
        assert extract_code("\n\n    return x\n  ") == "    return x"

    def test_sql_languages(self):
        assert extract_code("```sql\nSELECT 1;\n```", ("sql",)) == "SELECT 1;"


class TestNormalize:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("The Eiffel Tower!", "eiffel tower"),
            ("  an   apple, a day ", "apple day"),
            ("Washington, D.C.", "washington dc"),
            ("680,000", "680000"),
            ("THE", ""),
            ("theatre", "theatre"),  # articles only as whole words
            ("“Quoted” — dash", "quoted dash"),
            ("Straße", "strasse"),
            ("１２３", "123"),
            ("São Paulo", "são paulo"),
        ],
    )
    def test_cases(self, text, expected):
        assert normalize_answer(text) == expected

    def test_composed_and_decomposed_accents_agree(self):
        assert normalize_answer("Cafe\u0301") == normalize_answer("Caf\u00e9")

    def test_accents_still_matter(self):
        assert normalize_answer("Café") != normalize_answer("Cafe")


class TestGoldAnswers:
    @pytest.mark.parametrize(
        ("truth", "expected"),
        [
            ("Paris", ["Paris"]),
            (42, ["42"]),
            (4058.0, ["4058"]),
            (2.5, ["2.5"]),
            (Decimal("1.50"), ["1.5"]),
            (True, ["yes"]),
            (False, ["no"]),
            (["a", "b"], ["a", "b"]),
            ({"target": ["x", 3]}, ["x", "3"]),
            ({"answers": "y"}, ["y"]),
            ((1, (2, "c")), ["1", "2", "c"]),
        ],
    )
    def test_shapes(self, truth, expected):
        assert gold_answers(truth) == expected

    def test_numpy_values_from_parquet(self):
        assert gold_answers({"target": np.array(["a", "b"], dtype=object)}) == ["a", "b"]
        assert gold_answers(np.int64(7)) == ["7"]

    @pytest.mark.parametrize(
        ("truth", "message"),
        [(None, "missing"), ([], "empty"), ({"nope": 1}, "keys"), (object(), "must be")],
    )
    def test_bad_shapes_say_why(self, truth, message):
        with pytest.raises(GroundTruthError, match=message):
            gold_answers(truth)

    def test_format_number(self):
        assert format_number(1e20) == "100000000000000000000"
        assert format_number(-0.125) == "-0.125"
        assert format_number(3) == "3"
