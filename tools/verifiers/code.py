"""``code_tests``: run the candidate program against the task's tests in the sandbox.

``ground_truth`` (HumanEval style)::

    {"tests": "def check(candidate):\\n    assert candidate(2) == 4\\n ...",
     "entry_point": "double",          # check(<entry_point>) is called when tests define check
     "prompt": "def double(x):\\n"}     # optional: prepended when the candidate is an indented body

``tests`` (or HumanEval's key ``test``) may also be a list of statements, MBPP style
(``["assert double(2) == 4", ...]``): each item is one test.

The candidate is the last ```python block of the answer, else the answer itself. The
candidate and the tests run together in ``tools.sandbox.run_python`` (a separate,
resource-limited process); nothing of either ever runs in this process. A small harness
(``code_harness.py``, sent as source) rewrites each ``assert`` of the tests so that a
failing assertion is counted instead of stopping the run, so the score is the fraction of assertions that passed. A run that
dies early (timeout, crash, ``exit()``) counts every assertion it did not reach as failed.

Options in ``request.arguments``: ``timeout_s`` (default 10), ``memory_mb`` (default
512), ``all_or_nothing`` (bool: score 1 only when every test passed).

Trust: the harness reports through stdout lines prefixed with a random per-run nonce,
but it shares a process with the candidate, so a program written to attack the harness
could forge a report. That is acceptable for RL rewards on our own models; do not use it
to grade adversarial submissions.
"""

from __future__ import annotations

import ast
import json
import secrets
from pathlib import Path
from typing import Any

from protocol import VerifyRequest, VerifyResult, verifier
from tools.verifiers.text import extract_answer, extract_code, final_text

MAX_MARKERS = 1000  # per-assertion progress lines; the final summary still counts all
# Sent to the sandbox as source, not imported: nothing of the candidate runs in this process.
_HARNESS = Path(__file__).with_name("code_harness.py").read_text(encoding="utf-8")


class TaskError(ValueError):
    """The task's ground truth is unusable; the message says what is missing."""


def _read_task(ground_truth: Any) -> tuple[str | list[str], str | None, str | None]:
    if not isinstance(ground_truth, dict):
        raise TaskError('code_tests needs ground_truth {"tests": ..., "entry_point": ...}')
    tests = ground_truth.get("tests", ground_truth.get("test"))
    if hasattr(tests, "tolist"):  # a numpy array, as lists come back from parquet
        tests = tests.tolist()
    if isinstance(tests, str) and tests.strip():
        pass
    elif isinstance(tests, list | tuple) and tests and all(isinstance(t, str) for t in tests):
        tests = list(tests)
    else:
        raise TaskError("ground_truth.tests must be test code or a non-empty list of test statements")
    entry = ground_truth.get("entry_point")
    prompt = ground_truth.get("prompt")
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
        raise TaskError(f"ground_truth.entry_point must be a function name, got {entry!r}")
    return tests, entry, prompt if isinstance(prompt, str) else None


def static_assert_count(tests: str | list[str]) -> int:
    """How many tests the harness would count if nothing looped: a floor for the total."""
    if isinstance(tests, list):
        return len(tests)
    try:  # parsing is safe: nothing runs here
        return sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(tests)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1


def build_program(code: str, tests: str | list[str], entry: str | None, nonce: str) -> str:
    """The harness source and a call that hands it the candidate and the tests (as a JSON literal)."""
    config = json.dumps(
        {"nonce": nonce, "code": code, "tests": tests, "entry": entry, "max_markers": MAX_MARKERS}
    )
    return f"{_HARNESS}\n\nrun({config!r})\n"


def read_report(stdout: str, nonce: str) -> tuple[dict[str, Any] | None, int, int]:
    """The final summary (None if the run never got there) and the pass/fail markers seen."""
    summary = None
    passed = failed = 0
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            continue
        body = line[len(nonce) :]
        if body == ".":
            passed += 1
        elif body == "x":
            failed += 1
        elif body.startswith("{"):
            try:
                summary = json.loads(body)
            except ValueError:
                summary = None
    return summary, passed, failed


@verifier(name="code_tests", timeout_s=120.0)
async def code_tests(request: VerifyRequest) -> VerifyResult:
    """Fraction of the task's tests that the candidate program passes, run in the sandbox."""
    answer, tagged = extract_answer(final_text(request), strip=False)
    code = extract_code(answer)
    details: dict[str, Any] = {"tagged": tagged, "code_chars": len(code)}
    components = {"pass_rate": 0.0, "all_passed": 0.0, "runs": 0.0}
    arguments = request.arguments
    try:
        tests, entry, prompt = _read_task(request.ground_truth)
        timeout_s = float(arguments.get("timeout_s", 10.0))
        memory_mb = int(arguments.get("memory_mb", 512))
    except (TaskError, TypeError, ValueError) as exc:
        details["error"] = str(exc)
        return VerifyResult(0.0, components, details)
    if not code:
        details["error"] = "no code in the response"
        return VerifyResult(0.0, components, details)
    if prompt and code[:1].isspace():
        code = prompt.rstrip() + "\n" + code  # a HumanEval completion: an indented body

    try:
        from tools.sandbox import run_python
    except ImportError as exc:
        details["error"] = f"the sandbox is not available: {exc}"
        return VerifyResult(0.0, components, details)

    nonce = "@@TF" + secrets.token_hex(8) + "@@"
    try:
        outcome = await run_python(
            build_program(code, tests, entry, nonce), timeout_s=timeout_s, memory_mb=memory_mb
        )
    except Exception as exc:  # the sandbox itself failed: no verdict on the candidate
        details["error"] = f"sandbox failed: {type(exc).__name__}: {exc}"
        return VerifyResult(0.0, components, details)
    summary, marked_passed, marked_failed = read_report(outcome.stdout or "", nonce)
    details.update(
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        elapsed_ms=outcome.elapsed_ms,
        stderr=(outcome.stderr or "")[-1000:],
    )
    if outcome.error:
        details["sandbox_error"] = outcome.error

    static_total = static_assert_count(tests)
    if summary is not None:
        passed, failed = int(summary["passed"]), int(summary["failed"])
        details["failures"] = summary.get("failures", [])
        details["event"] = summary.get("event")
        if summary.get("error"):
            details["error"] = summary["error"]
        finished = summary.get("event") == "done"
    else:
        passed, failed, finished = marked_passed, marked_failed, False
        details["event"] = "timeout" if outcome.timed_out else "crashed"
    # An unfinished run fails whatever it did not reach (at least one: the one it died in).
    total = passed + failed if finished else max(static_total, passed + failed + 1)
    details.update(passed=passed, total=total)
    components["runs"] = 1.0 if summary is not None and summary.get("event") != "candidate_error" else 0.0
    components["pass_rate"] = passed / total if total else 0.0
    components["all_passed"] = 1.0 if finished and failed == 0 and passed > 0 else 0.0
    score = components["all_passed"] if arguments.get("all_or_nothing") else components["pass_rate"]
    return VerifyResult(score, components, details)
