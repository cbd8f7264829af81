"""``math_equal``: mathematical equivalence of the answer and the gold, via ``math-verify``.

Plain numbers (``42``, ``-3.50``, ``1,234``) are compared exactly with ``Fraction`` in
the calling thread: that is most arithmetic rewards and costs microseconds. Anything
else (fractions, LaTeX, expressions, sets) goes to ``math_verify.parse``/``verify`` in a
small pool of long-lived worker subprocesses (JSON lines over pipes), because:

- math-verify enforces its time limits with ``signal.alarm``, which only works in a
  main thread; the server runs tools in worker threads, and an unlimited sympy
  simplification of model output (``9^9^9^9``) can run for minutes. A pool worker runs
  each task in its own main thread, so the limits work there;
- a worker stuck in C code past the hard deadline is killed and replaced, which a
  thread could never be.

Plain subprocesses, not ``multiprocessing``: spawn-based pools re-import the caller's
``__main__``, which breaks scripts without a main guard (a veRL reward module, a REPL).

Options in ``request.arguments``: ``rel_tol`` (float, default 0: exact) for the number
fast path, ``timeout_s`` (default 5) for math-verify's parse/verify limits, and
``require_answer_tag`` (bool, default false). Gold answers are read as described in
``tools.verifiers.text`` (any one of several golds may match). A parse failure scores 0
with ``details.error``; this verifier never raises.

``TOOLFACTORY_MATH_WORKERS`` sets the pool size (default: min(4, CPU count)).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

from protocol import VerifyRequest, VerifyResult, verifier
from tools.verifiers.text import GroundTruthError, extract_answer, final_text, gold_answers

# An exponent of at most 3 digits: Fraction("1e10000000") builds a 10-million-digit integer.
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d{1,3})?")
_HAS_DIGIT = re.compile(r"\d")
_HARD_DEADLINE_EXTRA_S = 10.0  # past math-verify's own limits before a worker is killed
_REPO_ROOT = str(Path(__file__).resolve().parents[2])  # so workers can import tools.*


def plain_number(text: str) -> Fraction | None:
    """``text`` as an exact number if it is a plain decimal (``$``, ``\\boxed{}``, ``.`` stripped)."""
    text = text.strip().rstrip(".").strip()
    if text.startswith("\\boxed{") and text.endswith("}"):
        text = text[7:-1].strip()
    text = text.strip("$").strip()
    if not text or not _PLAIN_NUMBER.fullmatch(text) or not _HAS_DIGIT.search(text):
        return None
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _numbers_equal(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    if rel_tol <= 0:
        return a == b
    return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))


def _latex_candidates(text: str) -> list[str]:
    """Ways to read ``text``: as inline LaTeX first (``x+1``, ``\\frac12``), then as it is."""
    text = text.strip()
    if not text:
        return []
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return [text]
    return [f"${text}$", text]


@lru_cache(maxsize=4096)
def _parse_cached(text: str, timeout_s: int) -> tuple[Any, ...]:
    from math_verify import parse

    return tuple(parse(text, parsing_timeout=timeout_s))


def check_equal(prediction: str, golds: list[str], timeout_s: int = 5) -> dict:
    """Run math-verify on one prediction against several golds; never raises.

    Call it in a main thread (a pool worker, a script): math-verify's limits use
    ``signal.alarm``. Off the main thread it runs without limits. Returns
    ``{"equal": bool, "parsed_answer": str, "parsed_gold": str, "error": str | None}``.
    """
    from math_verify import verify

    if threading.current_thread() is not threading.main_thread():
        timeout_s = 0  # signal.alarm raises off the main thread; run unlimited instead
    try:
        predictions = [
            p for text in _latex_candidates(prediction) for p in _parse_cached(text, timeout_s)[:1]
        ]
        if not predictions:
            return {"equal": False, "error": f"could not parse the answer {prediction[:200]!r}"}
        parsed_golds = []
        for gold in golds:
            parsed = next(
                (p for text in _latex_candidates(gold) for p in _parse_cached(text, timeout_s)), None
            )
            if parsed is not None:
                parsed_golds.append(parsed)
        if not parsed_golds:
            return {"equal": False, "error": f"could not parse any gold answer of {golds!r}"}
        for gold in parsed_golds:
            for pred in predictions:
                if verify(gold, pred, timeout_seconds=timeout_s or None):
                    return {
                        "equal": True,
                        "parsed_answer": str(pred),
                        "parsed_gold": str(gold),
                        "error": None,
                    }
        return {
            "equal": False,
            "parsed_answer": str(predictions[0]),
            "parsed_gold": str(parsed_golds[0]),
            "error": None,
        }
    except BaseException as exc:  # math-verify / sympy can raise nearly anything, incl. timeouts
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return {"equal": False, "error": f"math-verify failed: {type(exc).__name__}: {exc}"}


class _Worker:
    """One math-verify subprocess answering JSON lines on stdin/stdout, one request at a time."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from tools.verifiers.math import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=_REPO_ROOT,  # never a folder whose math.py (like this one) would shadow the stdlib
        )

    def ask(self, request: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """Send one request and wait for its answer; TimeoutError past ``deadline_s``."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], deadline_s)
        if not ready:
            raise TimeoutError
        line = self.process.stdout.readline()
        if not line:
            raise ConnectionError(f"math-verify worker exited with code {self.process.wait()}")
        return json.loads(line)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


class _WorkerPool:
    """At most ``size`` workers, reused; a worker that times out or dies is killed and replaced.

    Blocking (pipes, select), so it is loop-agnostic: callers reach it through a thread.
    """

    def __init__(self, size: int) -> None:
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)

    def run(self, request: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        with self._slots:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker()
            try:
                answer = worker.ask(request, deadline_s)
            except BaseException:
                worker.kill()
                raise
            self._idle.put(worker)
            return answer

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


_pool: _WorkerPool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _WorkerPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            size = int(os.environ.get("TOOLFACTORY_MATH_WORKERS") or min(4, os.cpu_count() or 1))
            _pool = _WorkerPool(max(1, size))
        return _pool


def shutdown_pool() -> None:
    """Stop the idle math-verify worker processes (tests, server shutdown)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


def worker_main() -> None:
    """Body of a worker process: one JSON request per stdin line, one JSON answer per line."""
    for line in sys.stdin.buffer:
        request = json.loads(line)
        answer = check_equal(request["prediction"], request["golds"], request["timeout_s"])
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


async def _check_in_pool(prediction: str, golds: list[str], timeout_s: int) -> dict[str, Any]:
    request = {"prediction": prediction, "golds": golds, "timeout_s": timeout_s}
    # math-verify limits each parse/verify step; the hard deadline covers the whole request
    # (several steps, plus the worker's first start) and C code that ignores signals.
    deadline_s = 4 * timeout_s + _HARD_DEADLINE_EXTRA_S
    try:
        return await asyncio.to_thread(_get_pool().run, request, deadline_s)
    except TimeoutError:
        return {
            "equal": False,
            "error": f"math-verify did not answer within {deadline_s:.0f}s; worker killed",
        }
    except (ConnectionError, OSError, ValueError) as exc:
        return {"equal": False, "error": f"math-verify worker failed: {exc}"}


@verifier(name="math_equal", timeout_s=60.0)
async def math_equal(request: VerifyRequest) -> VerifyResult:
    """1.0 when the answer is mathematically equal to any gold answer, else 0.0."""
    text = final_text(request)
    answer, tagged = extract_answer(text)
    details: dict[str, Any] = {"answer": answer, "tagged": tagged}
    try:
        golds = gold_answers(request.ground_truth)
    except GroundTruthError as exc:
        details["error"] = str(exc)
        return VerifyResult(0.0, {"math_equal": 0.0}, details)
    details["golds"] = golds
    arguments = request.arguments
    if not tagged and arguments.get("require_answer_tag"):
        details["error"] = "no <answer> tag in the response"
        return VerifyResult(0.0, {"math_equal": 0.0}, details)
    if not answer:
        details["error"] = "empty answer"
        return VerifyResult(0.0, {"math_equal": 0.0}, details)

    predicted = plain_number(answer)
    gold_numbers = [plain_number(gold) for gold in golds]
    if predicted is not None and all(g is not None for g in gold_numbers):
        rel_tol = float(arguments.get("rel_tol") or 0.0)
        equal = any(_numbers_equal(predicted, g, rel_tol) for g in gold_numbers if g is not None)
        details["path"] = "number"
        score = 1.0 if equal else 0.0
        return VerifyResult(score, {"math_equal": score}, details)

    timeout_s = max(1, int(arguments.get("timeout_s") or 5))
    # Untagged text goes to math-verify whole: it finds \boxed{} or the last expression itself.
    outcome = await _check_in_pool(answer if tagged else text, golds, timeout_s)
    details["path"] = "math_verify"
    details.update({k: v for k, v in outcome.items() if k != "equal" and v is not None})
    score = 1.0 if outcome["equal"] else 0.0
    return VerifyResult(score, {"math_equal": score}, details)
