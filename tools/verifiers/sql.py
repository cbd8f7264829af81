"""``sql_match``: execution match of a predicted SQL query against the gold query (SQLite).

Both queries run on the same database file, opened read-only (``file:…?mode=ro``) with
an authorizer that refuses writes, ATTACH and PRAGMA, and a progress handler that stops
a query past its time limit. The result sets are compared as multisets of rows
(duplicates count, order does not) unless the gold query has a top-level ORDER BY, in
which case order matters too. Column order always matters; values compare after light
normalisation (``1`` == ``1.0``; floats rounded to ``float_digits`` places).

``ground_truth``: ``{"sql": "<gold query>", "db_path": "<file>"}`` or just the gold query
as a string with ``arguments.db_path``. The predicted query is the last ```sql fenced
block in the answer, else the answer itself. Options in ``request.arguments``:
``db_path``, ``max_rows`` (default 10,000: a larger result scores 0), ``timeout_s``
(default 5 per query), ``float_digits`` (default 6).

If ``TOOLFACTORY_SQL_DB_ROOT`` is set, database paths must lie under it (a server open
to untrusted clients should set it). Bad SQL, a missing database or a limit hit scores 0
with the reason in ``details.error``; the verifier never raises.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from protocol import VerifyRequest, VerifyResult, verifier
from tools.verifiers.text import extract_answer, extract_code, final_text

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_STRINGS_AND_COMMENTS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)
_PARENS = re.compile(r"\([^()]*\)")
_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
_PROGRESS_STEPS = 1000  # VM instructions between deadline checks


class QueryError(Exception):
    """A query could not be run or exceeded a limit; the message says which and why."""


def has_top_level_order_by(sql: str) -> bool:
    """Whether ORDER BY applies to the whole result (not only inside a subquery)."""
    text = _STRINGS_AND_COMMENTS.sub(" ", sql)
    while True:  # drop parenthesised parts, innermost first
        stripped = _PARENS.sub(" ", text)
        if stripped == text:
            break
        text = stripped
    return bool(_ORDER_BY.search(text))


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def _connect(db_path: str) -> sqlite3.Connection:
    uri = f"file:{quote(db_path)}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise QueryError(f"cannot open database {db_path!r}: {exc}") from None
    connection.set_authorizer(_authorize)
    return connection


def run_query(
    connection: sqlite3.Connection, sql: str, max_rows: int, timeout_s: float
) -> list[tuple[Any, ...]]:
    """All rows of ``sql``; QueryError on bad SQL, a write, > ``max_rows`` rows or the deadline."""
    deadline = time.monotonic() + timeout_s
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
    try:
        cursor = connection.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.Error as exc:
        if time.monotonic() > deadline:
            raise QueryError(f"query ran longer than {timeout_s:g}s") from None
        raise QueryError(f"{type(exc).__name__}: {exc}") from None
    except (ValueError, OverflowError) as exc:  # e.g. embedded NUL, huge integers
        raise QueryError(str(exc)) from None
    finally:
        connection.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        raise QueryError(f"query returned more than {max_rows} rows")
    return rows


def _normalize_value(value: Any, float_digits: int) -> Any:
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        return round(value, float_digits)
    return value


def normalize_rows(rows: list[tuple[Any, ...]], float_digits: int) -> list[tuple[Any, ...]]:
    return [tuple(_normalize_value(v, float_digits) for v in row) for row in rows]


def _jsonable(row: tuple[Any, ...]) -> list[Any]:
    return [v.hex() if isinstance(v, bytes) else v for v in row]


def _resolve_db(path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise QueryError('no database: give ground_truth {"sql": ..., "db_path": ...} or arguments.db_path')
    resolved = Path(path).expanduser().resolve()
    root = os.environ.get("TOOLFACTORY_SQL_DB_ROOT")
    if root and not resolved.is_relative_to(Path(root).expanduser().resolve()):
        raise QueryError(f"database {path!r} is outside TOOLFACTORY_SQL_DB_ROOT")
    if not resolved.is_file():
        raise QueryError(f"database file {path!r} does not exist")
    return str(resolved)


def _gold_and_db(request: VerifyRequest) -> tuple[str, str]:
    truth, arguments = request.ground_truth, request.arguments
    if isinstance(truth, dict):
        gold = truth.get("sql") or truth.get("query")
        db = truth.get("db_path") or truth.get("db") or arguments.get("db_path")
    else:
        gold, db = truth, arguments.get("db_path")
    if not isinstance(gold, str) or not gold.strip():
        raise QueryError('ground_truth needs the gold query: a string or {"sql": "..."}')
    return gold, _resolve_db(db)


@verifier(name="sql_match", timeout_s=30.0)
def sql_match(request: VerifyRequest) -> VerifyResult:
    """1.0 when the predicted query returns the same rows as the gold query, else 0.0."""
    answer, tagged = extract_answer(final_text(request))
    predicted = extract_code(answer, ("sql", "sqlite", "")).strip()
    details: dict[str, Any] = {"predicted_sql": predicted, "tagged": tagged}
    components = {"execution_match": 0.0, "executes": 0.0}
    arguments = request.arguments
    try:
        max_rows = int(arguments.get("max_rows", 10_000))
        timeout_s = float(arguments.get("timeout_s", 5.0))
        float_digits = int(arguments.get("float_digits", 6))
        gold, db_path = _gold_and_db(request)
    except (QueryError, TypeError, ValueError) as exc:
        details["error"] = str(exc)
        return VerifyResult(0.0, components, details)
    if not predicted:
        details["error"] = "empty query"
        return VerifyResult(0.0, components, details)

    try:
        connection = _connect(db_path)
    except QueryError as exc:
        details["error"] = str(exc)
        return VerifyResult(0.0, components, details)
    try:
        try:
            gold_rows = normalize_rows(run_query(connection, gold, max_rows, timeout_s), float_digits)
        except QueryError as exc:
            details["error"] = f"the gold query failed (fix the task data): {exc}"
            return VerifyResult(0.0, components, details)
        try:
            predicted_rows = normalize_rows(
                run_query(connection, predicted, max_rows, timeout_s), float_digits
            )
        except QueryError as exc:
            details["error"] = f"the predicted query failed: {exc}"
            return VerifyResult(0.0, components, details)
    finally:
        connection.close()

    components["executes"] = 1.0
    ordered = has_top_level_order_by(gold)
    # SQLite values (None, int, float, str, bytes) are hashable, so rows can be counted.
    match = predicted_rows == gold_rows if ordered else Counter(predicted_rows) == Counter(gold_rows)
    components["execution_match"] = 1.0 if match else 0.0
    details.update(
        ordered=ordered,
        gold_rows=len(gold_rows),
        predicted_rows=len(predicted_rows),
        sample_predicted=[_jsonable(r) for r in predicted_rows[:5]],
        sample_gold=[_jsonable(r) for r in gold_rows[:5]],
    )
    return VerifyResult(components["execution_match"], components, details)
