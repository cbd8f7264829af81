"""The harness that ``code_tests`` runs in the sandbox around a candidate program and its tests.

``tools.verifiers.code.build_program`` sends this file's source followed by one call,
``run(<json config>)``: the sandbox cannot see the project, so the harness travels as
source (and has no ``__main__`` block: the sandbox runs its cells as ``__main__``).
Standard library only, nothing from the project.

Each ``assert`` of the tests is rewritten into a call that counts its outcome instead of
stopping the run, and progress is reported on stdout in lines that start with a random
per-run nonce (the candidate's own prints go to /dev/null).
"""

from __future__ import annotations

import ast
import json
import os
import sys
from collections.abc import Callable
from typing import Any


class Harness:
    """Counts passed and failed tests and reports them on fd 1, each line prefixed by the nonce."""

    def __init__(self, nonce: str, max_markers: int) -> None:
        self.nonce = nonce
        self.max_markers = max_markers
        self.state: dict[str, Any] = {"passed": 0, "failed": 0, "failures": []}

    def emit(self, text: str) -> None:
        # os.write: the candidate may have replaced or closed sys.stdout
        os.write(1, (self.nonce + text + "\n").encode("utf-8", "replace"))

    def record(self, ok: bool, where: str, error: str | None = None) -> None:
        self.state["passed" if ok else "failed"] += 1
        if not ok and len(self.state["failures"]) < 5:
            self.state["failures"].append({"where": where, "error": error})
        if self.state["passed"] + self.state["failed"] <= self.max_markers:
            self.emit("." if ok else "x")  # a run that dies later is still scored on these

    def check(self, test: Callable[[], object], where: str) -> None:
        """What each rewritten ``assert`` calls."""
        try:
            ok = bool(test())
            error = None if ok else "assertion failed"
        except BaseException as exc:  # the code under test may raise anything, exit() included
            ok, error = False, type(exc).__name__ + ": " + str(exc)[:200]
        self.record(ok, where, error)

    def summary(self, event: str, error: str | None = None) -> None:
        self.emit(json.dumps(dict(self.state, event=event, error=error)))


class RewriteAsserts(ast.NodeTransformer):
    """``assert test`` becomes ``<check_name>(lambda: test, "tests line N")``."""

    def __init__(self, check_name: str) -> None:
        self.check_name = check_name

    def visit_Assert(self, node: ast.Assert) -> ast.Expr:
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        call = ast.Call(
            func=ast.Name(id=self.check_name, ctx=ast.Load()),
            args=[ast.Lambda(args=no_args, body=node.test), ast.Constant(f"tests line {node.lineno}")],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(call), node)


def run(config_json: str) -> None:
    """Run the candidate, then its tests, in one namespace of their own; report the outcome.

    ``config_json``: ``{"nonce", "code", "tests" (source or a list of statements),
    "entry" (or null), "max_markers"}``.
    """
    config = json.loads(config_json)
    code, tests, entry = config["code"], config["tests"], config["entry"]
    harness = Harness(config["nonce"], config["max_markers"])
    check_name = "_tf_assert_" + harness.nonce.strip("@")  # a name the candidate cannot guess
    namespace: dict[str, Any] = {"__name__": "__candidate__"}
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the program's prints cannot crowd out the report
    try:
        exec(compile(code, "<candidate>", "exec"), namespace)  # noqa: S102 - confined by the sandbox
    except BaseException as exc:
        return harness.summary("candidate_error", type(exc).__name__ + ": " + str(exc)[:500])
    if entry and entry not in namespace:
        return harness.summary("candidate_error", "the program does not define " + repr(entry))
    namespace[check_name] = harness.check  # only after the candidate ran
    if isinstance(tests, list):
        for index, statement in enumerate(tests):
            try:
                exec(compile(statement, f"<test {index}>", "exec"), namespace)  # noqa: S102
            except BaseException as exc:
                harness.record(False, f"test {index}", type(exc).__name__ + ": " + str(exc)[:200])
            else:
                harness.record(True, f"test {index}")
        return harness.summary("done")
    try:
        tree = ast.fix_missing_locations(RewriteAsserts(check_name).visit(ast.parse(tests)))
        exec(compile(tree, "<tests>", "exec"), namespace)  # noqa: S102
        if entry and callable(namespace.get("check")):
            namespace["check"](namespace[entry])
    except BaseException as exc:
        return harness.summary("tests_error", type(exc).__name__ + ": " + str(exc)[:500])
    return harness.summary("done")
