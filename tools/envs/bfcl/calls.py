"""Running BFCL's methods: one at a time, and their results as BFCL's checker reads them.

Both the tools (``packs``) and the verdict (``verdict``) call BFCL's API methods by
keyword on live instances; nothing is ``eval``-ed. ``contained`` keeps what a method sets
process-wide to the call that set it; ``bfcl_result`` is the string BFCL's executor
(``execute_multi_turn_func_call``) makes of a call, which its response check compares.
"""

from __future__ import annotations

import contextlib
import copy
import decimal
import inspect
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import mpmath

__all__ = ["BLOCKED", "bfcl_result", "contained", "public_methods"]

# Names BFCL's executor refuses to run whatever they belong to (its guard before ``eval``).
BLOCKED = frozenset(("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"))

_ONE_AT_A_TIME = threading.Lock()


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Keep what BFCL's methods set process-wide to the call that set it.

    MathAPI.logarithm sets mpmath's global precision and square_root the thread's decimal
    precision, for good; long-context get_outside_temperature_from_google writes its answer
    into a module dict it returns. Other sessions and tools in the server (math-verify's
    sympy uses mpmath) must not see them: calls run one at a time, in a decimal context of
    their own, and mpmath's precision is put back.
    """
    with _ONE_AT_A_TIME, decimal.localcontext():
        precision = mpmath.mp.prec
        try:
            yield
        finally:
            mpmath.mp.prec = precision


def public_methods(instances: Mapping[str, Any]) -> dict[str, Any]:
    """Method name -> bound method over ``instances``, as BFCL's executor maps them (a
    later class wins a name two share; names starting with ``_`` are not callable)."""
    out: dict[str, Any] = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                out[name] = method
    return out


def bfcl_result(methods: Mapping[str, Any], name: str, arguments: Mapping[str, Any]) -> str:
    """Run ``name(**arguments)`` on BFCL's instances; the string its executor records.

    The same outcome as BFCL ``eval``-ing the call string: an unknown name is a NameError,
    a blocked one is refused, an exception becomes "Error during execution: ...", a dict
    is ``json.dumps``-ed (``str`` when it cannot be), anything else but a str is ``str``-ed.
    Arguments are copied, with fresh defaults: a method keeps what it is given (see ``packs``).
    """
    try:
        if name in BLOCKED:
            raise Exception(f"Function call {name} is not allowed.")
        method = methods.get(name)
        if method is None:
            raise NameError(f"name '{name}' is not defined")
        try:
            bound = inspect.signature(method).bind(**arguments)
        except TypeError:
            given = dict(arguments)  # the call below raises the TypeError eval would
        else:
            bound.apply_defaults()
            given = bound.arguments
        with contained():  # rendered in here too: an mpf prints at the precision its method set
            return _rendered(method(**copy.deepcopy(given)))
    except Exception as exc:  # BFCL's executor catches every exception the same way
        return f"Error during execution: {exc}"


def _rendered(result: Any) -> str:
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:  # not JSON (an mpf inside): BFCL's bare except falls back the same way
            return str(result)
    return str(result)
