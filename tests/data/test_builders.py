"""Task data builders: schema, splits, determinism, and agreement with tools and verifiers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from protocol import VerifyRequest
from tools.calculator import evaluate
from tools.data import COLUMNS, arithmetic, search_qa
from tools.verifiers.format import format_check
from tools.verifiers.match import exact_match

REPO = Path(__file__).resolve().parents[2]


def check_schema(rows: list[dict], data_source: str, split: str) -> None:
    for index, row in enumerate(rows):
        assert tuple(row) == COLUMNS
        assert row["data_source"] == data_source
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"]["split"] == split
        assert row["extra_info"]["index"] == index
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in row["prompt"])
        assert row["prompt"][0]["role"] == "system"
        assert row["prompt"][-1]["role"] == "user"


class TestSearchQA:
    @pytest.fixture(scope="class")
    def rows(self):
        return search_qa.build_rows(seed=0, test_fraction=0.2)

    def test_schema(self, rows):
        check_schema(rows["train"], "toolfactory/search_qa", "train")
        check_schema(rows["test"], "toolfactory/search_qa", "test")

    def test_split_sizes(self, rows):
        total = len(search_qa.collect_questions())
        assert total > 300  # hundreds of FanOutQA sub-questions point at corpus pages
        assert len(rows["train"]) + len(rows["test"]) == total
        assert len(rows["test"]) == round(total * 0.2)

    def test_no_question_in_both_splits(self, rows):
        train = {r["extra_info"]["question"] for r in rows["train"]}
        test = {r["extra_info"]["question"] for r in rows["test"]}
        assert not train & test
        assert len(train) == len(rows["train"])

    def test_evidence_is_in_the_corpus(self, rows):
        corpus = search_qa.load_corpus_titles()
        assert all(r["extra_info"]["evidence_title"] in corpus for r in rows["train"] + rows["test"])

    def test_ground_truth_is_searchr1_targets(self, rows):
        for row in rows["train"] + rows["test"]:
            targets = row["reward_model"]["ground_truth"]["target"]
            assert targets and all(isinstance(t, str) and t.strip() for t in targets)

    def test_prompt_asks_for_search_and_answer_tags(self, rows):
        system, user = rows["test"][0]["prompt"]
        assert "<search>" in system["content"] and "<answer>" in system["content"]
        assert user["content"] == "Question: " + rows["test"][0]["extra_info"]["question"]

    def test_gold_answer_scores_one_with_exact_match(self, rows):
        for row in rows["test"][:50]:
            truth = row["reward_model"]["ground_truth"]
            response = f"<think>found it</think><answer>{truth['target'][0]}</answer>"
            assert (
                exact_match(VerifyRequest("exact_match", ground_truth=truth, response=response)).score == 1.0
            )

    def test_answer_targets(self):
        assert search_qa.answer_targets(680000) == ["680000", "680,000"]
        assert search_qa.answer_targets(4058.0) == ["4058", "4,058"]
        assert search_qa.answer_targets(2.5) == ["2.5"]
        assert search_qa.answer_targets(True) == ["yes"]
        assert search_qa.answer_targets(["Asia"]) == ["Asia"]
        assert search_qa.answer_targets(["a", "b"]) is None
        assert search_qa.answer_targets({"a": 1}) is None
        assert search_qa.answer_targets("  ") is None

    def test_deterministic_and_seed_dependent(self, rows):
        assert search_qa.build_rows(seed=0) == rows
        other = search_qa.build_rows(seed=1)
        assert other["test"] != rows["test"]

    def test_bad_fraction(self):
        with pytest.raises(ValueError, match="test_fraction"):
            search_qa.build_rows(test_fraction=1.5)


class TestArithmetic:
    @pytest.fixture(scope="class")
    def rows(self):
        return arithmetic.build_rows(n_train=400, n_test=100, seed=0)

    def test_schema_and_sizes(self, rows):
        check_schema(rows["train"], "toolfactory/arithmetic", "train")
        check_schema(rows["test"], "toolfactory/arithmetic", "test")
        assert len(rows["train"]) == 400 and len(rows["test"]) == 100

    def test_answers_agree_with_the_calculator_tool(self, rows):
        for row in rows["train"] + rows["test"]:
            info = row["extra_info"]
            assert evaluate(info["expression"]) == row["reward_model"]["ground_truth"]
            assert isinstance(row["reward_model"]["ground_truth"], int)

    def test_problems_need_a_calculator(self, rows):
        kinds = {r["extra_info"]["kind"] for r in rows["train"]}
        assert kinds == set(arithmetic.GENERATORS)
        for row in rows["train"]:
            info = row["extra_info"]
            if info["kind"] == "multiply":
                assert info["num_steps"] == 1
                assert all(100 <= x <= 9999 for x in info["operands"])
            else:
                assert info["num_steps"] >= 2
            assert row["reward_model"]["ground_truth"] > 10_000  # beyond mental arithmetic

    def test_no_expression_in_both_splits(self, rows):
        train = {r["extra_info"]["expression"] for r in rows["train"]}
        test = {r["extra_info"]["expression"] for r in rows["test"]}
        assert not train & test
        assert len(train) + len(test) == 500

    def test_prompt_has_three_worked_examples_by_default(self, rows):
        prompt = rows["test"][0]["prompt"]
        assert prompt[0]["content"] == arithmetic.ARITHMETIC_SYSTEM_PROMPT
        assert prompt[1:-1] == arithmetic.few_shot_messages(3)
        assert prompt[-1] == {"role": "user", "content": rows["test"][0]["extra_info"]["question"]}

    def test_worked_examples_are_correct_and_well_formed(self):
        messages = arithmetic.few_shot_messages(len(arithmetic.FEW_SHOT_EXAMPLES))
        for message in messages:
            if message["role"] == "assistant" and "<tool_call>" in message["content"]:
                body = message["content"].split("<tool_call>")[1].split("</tool_call>")[0]
                call = json.loads(body)
                assert call["name"] == "calculator"
                assert set(call["arguments"]) == {"expression"}
        for example in arithmetic.FEW_SHOT_EXAMPLES:
            for expression, result in example.calls:
                assert evaluate(expression) == result
            assert example.calls[-1][1] == example.answer
        # Each example, as a trajectory, is what the format verifier rewards.
        start = 0
        for i, message in enumerate(messages):
            if message["role"] == "assistant" and "<answer>" in message["content"]:
                trajectory = messages[start : i + 1]
                result = format_check(
                    VerifyRequest("format", messages=trajectory, arguments={"min_calls": 1})
                )
                assert result.score == 1.0, result.details
                start = i + 1

    def test_few_shot_options(self):
        assert arithmetic.few_shot_messages(0) == []
        one = arithmetic.few_shot_messages(1)
        assert [m["role"] for m in one] == ["user", "assistant", "tool", "assistant"]
        as_user = arithmetic.few_shot_messages(1, tool_role="user")
        assert as_user[2] == {"role": "user", "content": "<tool_response>\n1822306\n</tool_response>"}
        with pytest.raises(ValueError, match="few-shot count"):
            arithmetic.few_shot_messages(9)
        with pytest.raises(ValueError, match="tool_role"):
            arithmetic.few_shot_messages(1, tool_role="system")  # type: ignore[arg-type]
        rows = arithmetic.build_rows(n_train=3, n_test=1, few_shot=0)
        assert [m["role"] for m in rows["train"][0]["prompt"]] == ["system", "user"]

    def test_deterministic_and_seed_dependent(self, rows):
        assert arithmetic.build_rows(n_train=400, n_test=100, seed=0) == rows
        assert arithmetic.build_rows(n_train=400, n_test=100, seed=1)["test"] != rows["test"]

    def test_custom_mix_and_bad_kind(self):
        rows = arithmetic.build_rows(n_train=20, n_test=0, mix={"sum_of_products": 1.0})
        assert {r["extra_info"]["kind"] for r in rows["train"]} == {"sum_of_products"}
        assert rows["test"] == []
        with pytest.raises(ValueError, match="unknown problem kinds"):
            arithmetic.generate_problems(1, mix={"division": 1.0})


class TestCommandLine:
    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tools.data", *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )

    def test_build_twice_gives_the_same_parquet_rows(self, tmp_path):
        args = ("build", "--seed", "7", "--arith-train", "50", "--arith-test", "10")
        first = self.run(*args, "--out", str(tmp_path / "a"))
        second = self.run(*args, "--out", str(tmp_path / "b"))
        assert first.returncode == 0, first.stderr
        assert second.returncode == 0, second.stderr
        assert "[arithmetic] train: 50 rows" in first.stderr and "[search_qa] test:" in first.stderr
        for task in ("search_qa", "arithmetic"):
            for split in ("train", "test"):
                a = pd.read_parquet(tmp_path / "a" / task / f"{split}.parquet")
                b = pd.read_parquet(tmp_path / "b" / task / f"{split}.parquet")
                assert list(a.columns) == list(COLUMNS)
                assert a.to_json() == b.to_json()
        test = pd.read_parquet(tmp_path / "a" / "arithmetic" / "test.parquet")
        assert len(test) == 10
        row = test.iloc[0]
        assert row["reward_model"]["ground_truth"] == evaluate(row["extra_info"]["expression"])
        assert row["extra_info"]["num_steps"] >= 1

    def test_parquet_ground_truth_still_verifies(self, tmp_path):
        assert self.run("build", "--tasks", "search_qa", "--out", str(tmp_path)).returncode == 0
        row = pd.read_parquet(tmp_path / "search_qa" / "test.parquet").iloc[0]
        truth = row["reward_model"]["ground_truth"]  # numpy arrays inside, as veRL sees it
        response = f"<answer>{truth['target'][0]}</answer>"
        assert exact_match(VerifyRequest("exact_match", ground_truth=truth, response=response)).score == 1.0

    def test_help_and_errors(self, tmp_path):
        help_text = self.run("build", "--help")
        assert help_text.returncode == 0 and "--few-shot K" in help_text.stdout
        bad = self.run("build", "--tasks", "nope", "--out", str(tmp_path))
        assert bad.returncode == 2 and "unknown task" in bad.stderr
        few = self.run("build", "--tasks", "arithmetic", "--few-shot", "9", "--out", str(tmp_path))
        assert few.returncode == 1 and "few-shot count" in few.stderr
