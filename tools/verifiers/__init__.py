"""Built-in verifiers (reward functions), served on ``POST /v1/verify`` and as MCP tools
``verify_<name>`` in the ``verifiers`` toolset.

Each takes ``request: VerifyRequest`` (and, if it needs other tools, ``ctx: ToolContext``)
and returns ``VerifyResult(score, components, details)``. Options come from
``request.arguments``; how answers and ``ground_truth`` are read is described in
``tools.verifiers.text``. List them in a server config as ``tools.verifiers.match:exact_match``
etc., or use :data:`BUILTIN_VERIFIERS` (name -> function).
"""

from __future__ import annotations

from tools.verifiers.code import code_tests
from tools.verifiers.format import format_check
from tools.verifiers.judge import judge
from tools.verifiers.match import exact_match, f1
from tools.verifiers.math import math_equal
from tools.verifiers.sql import sql_match
from tools.verifiers.table import BUILTIN_VERIFIERS
from tools.verifiers.weighted import weighted

BUILTIN_VERIFIERS.update(
    {
        "exact_match": exact_match,
        "f1": f1,
        "math_equal": math_equal,
        "code_tests": code_tests,
        "sql_match": sql_match,
        "judge": judge,
        "format": format_check,
        "weighted": weighted,
    }
)

__all__ = [
    "BUILTIN_VERIFIERS",
    "code_tests",
    "exact_match",
    "f1",
    "format_check",
    "judge",
    "math_equal",
    "sql_match",
    "weighted",
]
