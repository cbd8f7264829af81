"""One request's code, run in the worker's persistent namespace like a REPL runs it.

The value of a trailing expression is returned (as its ``repr``), ``SystemExit`` becomes an
exit status, any other exception a traceback without the worker's own frames; every string
is cut to the request's output limit. Standard library only.
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import resource
import sys
import traceback
from typing import Any

__all__ = ["execute"]


def clean(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def capped(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[:limit], True)


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def format_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next  # drop the worker's own frames
    return "".join(traceback.format_exception(type(exc), exc, tb))


def reap_children() -> None:
    """Collect finished children: those the server killed after the last call, and orphans
    (this process is their subreaper), so they stop counting against RLIMIT_NPROC."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def execute(
    request: dict[str, Any],
    namespace: dict[str, Any],
    number: int,
    out: io.TextIOWrapper,
    err: io.TextIOWrapper,
    hard_cpu_s: int,
) -> dict[str, Any]:
    """Run one request (code, stdin, CPU seconds, output limit) with ``out`` and ``err`` as
    stdout and stderr; its reply, without ``seq``. ``hard_cpu_s``: the worker's lifetime
    CPU limit, which the call's own (soft) limit may not pass."""
    reap_children()
    code = request["code"]
    limit = request["max_output"]
    name = f"<cell {number}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    sys.stdin = io.StringIO(request["stdin"])
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = err
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = min(hard_cpu_s, int(used.ru_utime + used.ru_stime) + 1 + request["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard_cpu_s))
    reply = {"value": None, "error": None, "exit_code": 0, "truncated": False}
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), namespace)  # noqa: S102 - what the sandbox is for
        if last is not None:
            value = eval(compile(last, name, "eval"), namespace)  # noqa: S307 - likewise
            if value is not None:
                namespace["_"] = value
                reply["value"], reply["truncated"] = capped(clean(repr(value)), limit)
    except SystemExit as exc:
        reply["exit_code"] = exit_status(exc.code)
    except BaseException as exc:
        try:
            reply["error"], cut = capped(clean(format_error(exc)), limit)
        except BaseException:
            reply["error"], cut = clean(f"{type(exc).__name__} (traceback unavailable)"), False
        reply["truncated"] = reply["truncated"] or cut
        reply["exit_code"] = 1
    return reply
