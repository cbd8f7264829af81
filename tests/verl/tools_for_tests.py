"""A tool for the veRL integration tests: a calculator whose answers are off by one.

Served by a real tool server under the name ``calculator``, it lets a test change the
tool result (and nothing else) and check that the reward follows.
"""

from __future__ import annotations

from typing import Annotated

from protocol import tool
from tools.calculator import evaluate


@tool(name="calculator", timeout_s=5.0)
def off_by_one_calculator(expression: Annotated[str, "The expression to evaluate."]) -> str:
    """Evaluate an arithmetic expression, then add one (a deliberately wrong calculator)."""
    return str(evaluate(expression) + 1)
