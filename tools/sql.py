"""The ``sql`` tool: SQLite queries against a configured database, one connection per session.

Read-only (the default): every session opens the configured file with ``mode=ro`` and an
authorizer that allows only reads, so sessions cannot affect each other or the file.
Writable (``writable: true``): each session works on its own copy of the file (made with
SQLite's backup API, deleted when the session ends), so one trajectory's INSERTs are
invisible to every other trajectory and the original never changes.

In both modes the authorizer refuses ATTACH/DETACH (which would also let ``VACUUM INTO``
write arbitrary files), ``load_extension`` and all but a few read-only PRAGMAs; a progress
handler stops a query past its time limit; SQLite's own limits cap string/blob size and
statement length; at most ``max_rows`` rows come back.

With no database configured, a small demo database (a company: departments, employees,
projects, assignments) is built in the cache directory so the tool works out of the box.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import anyio

from protocol import ErrorKind, SessionState, ToolContext, ToolError, ToolOutput, tool
from tools.search.corpus import cache_dir

MAX_QUERY_CHARS = 100_000
_PROGRESS_STEPS = 1000  # SQLite VM instructions between deadline checks
_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
_ALWAYS_DENIED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH}
_SAFE_PRAGMAS = {
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "collation_list",
}
_DENIED_FUNCTIONS = {"load_extension"}
_ACTION_NAMES = {  # authorizer action codes -> words for error messages
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
        "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
        "DROP_VIEW", "INSERT", "TRANSACTION", "UPDATE", "ALTER_TABLE", "REINDEX", "ANALYZE",
        "CREATE_VTABLE", "DROP_VTABLE", "SAVEPOINT",
    )
}  # fmt: skip


# -- demo database -----------------------------------------------------------------------
_DEMO_SCHEMA = """
CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, city TEXT NOT NULL);
CREATE TABLE employees (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, department_id INTEGER REFERENCES departments(id),
    title TEXT NOT NULL, salary INTEGER NOT NULL, hired DATE NOT NULL, manager_id INTEGER REFERENCES employees(id)
);
CREATE TABLE projects (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, department_id INTEGER REFERENCES departments(id),
    budget INTEGER NOT NULL, started DATE NOT NULL
);
CREATE TABLE assignments (
    employee_id INTEGER REFERENCES employees(id), project_id INTEGER REFERENCES projects(id),
    hours INTEGER NOT NULL, PRIMARY KEY (employee_id, project_id)
);
"""
_DEPARTMENTS = [
    (1, "Engineering", "Berlin"),
    (2, "Sales", "Madrid"),
    (3, "Research", "Zurich"),
    (4, "Support", "Lisbon"),
]
_EMPLOYEES = [
    (1, "Ada Lovelace", 1, "CTO", 185000, "2015-03-01", None),
    (2, "Alan Turing", 3, "Head of Research", 172000, "2016-07-15", 1),
    (3, "Grace Hopper", 1, "Principal Engineer", 158000, "2017-01-09", 1),
    (4, "Edsger Dijkstra", 1, "Senior Engineer", 131000, "2018-05-21", 3),
    (5, "Barbara Liskov", 1, "Senior Engineer", 134000, "2018-11-02", 3),
    (6, "Ken Thompson", 1, "Engineer", 104000, "2020-02-17", 3),
    (7, "Margaret Hamilton", 3, "Researcher", 121000, "2019-04-01", 2),
    (8, "Claude Shannon", 3, "Researcher", 119000, "2019-09-23", 2),
    (9, "John McCarthy", 3, "Research Engineer", 112000, "2021-06-14", 2),
    (10, "Estee Lauder", 2, "Head of Sales", 150000, "2016-02-29", 1),
    (11, "Mary Kay Ash", 2, "Account Executive", 88000, "2019-08-05", 10),
    (12, "Dale Carnegie", 2, "Account Executive", 86000, "2020-10-12", 10),
    (13, "Zig Ziglar", 2, "Sales Associate", 64000, "2022-03-28", 10),
    (14, "Florence Nightingale", 4, "Support Lead", 92000, "2017-12-04", 1),
    (15, "Clara Barton", 4, "Support Engineer", 71000, "2021-01-18", 14),
    (16, "Dorothea Dix", 4, "Support Engineer", 69000, "2022-09-05", 14),
]
_PROJECTS = [
    (1, "Compiler", 1, 900000, "2021-01-04"),
    (2, "Search Engine", 1, 1200000, "2022-04-11"),
    (3, "Cryptanalysis", 3, 650000, "2020-09-01"),
    (4, "Information Theory", 3, 400000, "2023-02-06"),
    (5, "Enterprise Deals", 2, 300000, "2022-01-17"),
    (6, "Help Center", 4, 150000, "2023-05-22"),
]
_ASSIGNMENTS = [
    (3, 1, 320), (4, 1, 210), (6, 1, 400), (5, 2, 380), (6, 2, 120), (1, 2, 60), (2, 3, 200), (7, 3, 310),
    (8, 4, 290), (9, 4, 150), (9, 3, 90), (10, 5, 100), (11, 5, 340), (12, 5, 300), (13, 5, 410),
    (14, 6, 250), (15, 6, 330), (16, 6, 280), (3, 2, 75),
]  # fmt: skip


def build_demo_database(path: str | os.PathLike[str] | None = None) -> Path:
    """Create (once) the demo database and return its path (default: in the cache directory)."""
    target = Path(path) if path is not None else cache_dir() / "sql" / "demo-company-v1.sqlite"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    with sqlite3.connect(tmp) as conn:
        conn.executescript(_DEMO_SCHEMA)
        conn.executemany("INSERT INTO departments VALUES (?, ?, ?)", _DEPARTMENTS)
        conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?, ?, ?)", _EMPLOYEES)
        conn.executemany("INSERT INTO projects VALUES (?, ?, ?, ?, ?)", _PROJECTS)
        conn.executemany("INSERT INTO assignments VALUES (?, ?, ?)", _ASSIGNMENTS)
    conn.close()
    os.replace(tmp, target)
    return target


# -- one connection ----------------------------------------------------------------------
class _Denied(Exception):
    pass


@dataclass(eq=False)
class _Connection:
    """A guarded connection (authorizer, limits, deadline) and the copy it owns, if any."""

    conn: sqlite3.Connection
    copy_dir: str | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    deadline: float = 0.0
    denied: str | None = None

    @classmethod
    def open(cls, source: Path, *, writable: bool) -> _Connection:
        copy_dir = None
        if writable:
            copy_dir = tempfile.mkdtemp(prefix="toolfactory-sql-")
            path = Path(copy_dir) / source.name
            with (
                sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True) as src,
                sqlite3.connect(path) as dst,
            ):
                src.backup(dst)
            src.close()
            dst.close()
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        else:
            conn = sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True, check_same_thread=False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000_000)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS)
        self = cls(conn, copy_dir)
        conn.set_authorizer(self._authorize_write if writable else self._authorize_read)
        conn.set_progress_handler(self._check_deadline, _PROGRESS_STEPS)
        return self

    def close(self) -> None:
        self.conn.close()
        if self.copy_dir is not None:
            shutil.rmtree(self.copy_dir, ignore_errors=True)

    def _deny(self, reason: str) -> int:
        self.denied = reason
        return sqlite3.SQLITE_DENY

    def _common(self, action: int, arg1: str | None, arg2: str | None) -> int | None:
        if action in _ALWAYS_DENIED:
            return self._deny("ATTACH and DETACH (and VACUUM INTO) are not allowed")
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
            return self._deny(f"the function {arg2}() is not allowed")
        if action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in _SAFE_PRAGMAS:
                return sqlite3.SQLITE_OK
            return self._deny(f"PRAGMA {arg1} is not allowed (allowed: {', '.join(sorted(_SAFE_PRAGMAS))})")
        return None

    def _authorize_read(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        verdict = self._common(action, arg1, arg2)
        if verdict is not None:
            return verdict
        if action in _READ_ACTIONS:
            return sqlite3.SQLITE_OK
        needed = _ACTION_NAMES.get(action, f"action {action}")
        if arg1 in ("sqlite_master", "sqlite_schema", "sqlite_temp_master"):
            needed = "a schema change"
        return self._deny(
            f"the database is read-only: only statements that read are allowed (this one needs {needed})"
        )

    def _authorize_write(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        verdict = self._common(action, arg1, arg2)
        return sqlite3.SQLITE_OK if verdict is None else verdict

    def _check_deadline(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0

    def execute(
        self, query: str, max_rows: int, timeout_s: float
    ) -> tuple[list[str], list[tuple[Any, ...]], bool, int]:
        """Run one statement: (columns, rows, truncated, rows changed). Blocking: run it in a thread."""
        self.denied = None
        self.deadline = time.monotonic() + timeout_s
        cursor = self.conn.cursor()
        try:
            cursor.execute(query)
            rows = cursor.fetchmany(max_rows + 1) if cursor.description else []
            columns = [d[0] for d in cursor.description or ()]
            return columns, rows[:max_rows], len(rows) > max_rows, cursor.rowcount
        finally:
            cursor.close()


# -- the tool ----------------------------------------------------------------------------
def _cell(value: Any, limit: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"<blob {len(value)} bytes>"
    text = repr(value) if isinstance(value, float) else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_value(value: Any, limit: int) -> Any:
    if isinstance(value, bytes):
        return f"<blob {len(value)} bytes>"
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 1] + "…"
    return value


def render_table(
    columns: list[str], rows: list[tuple[Any, ...]], truncated: bool, max_cell_chars: int = 200
) -> str:
    """A plain-text table a model reads easily: header, separator, rows, row count."""
    cells = [[_cell(v, max_cell_chars) for v in row] for row in rows]
    names = [_cell(c, max_cell_chars) for c in columns]
    widths = [max([len(names[i])] + [len(r[i]) for r in cells]) for i in range(len(names))]
    lines = [" | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    lines.extend(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    count = len(rows)
    if truncated:
        lines.append(f"({count} rows shown; more rows were cut: add LIMIT or narrow the query)")
    else:
        lines.append(f"({count} row{'s' if count != 1 else ''})")
    return "\n".join(lines)


@tool(name="sql", stateful=True, timeout_s=60)
class SqlTool:
    """Run one SQL statement (SQLite dialect) against the task's database and see the result table.

    List the tables with: SELECT name, sql FROM sqlite_master WHERE type = 'table'.
    """

    def __init__(
        self,
        database: str | None = None,
        writable: bool = False,
        max_rows: int = 50,
        timeout_s: float = 5.0,
        max_cell_chars: int = 200,
    ) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self.database = Path(database) if database else None
        self.writable = writable
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self.max_cell_chars = max_cell_chars
        self._key = f"sql-tool:{id(self)}"
        self._open: set[_Connection] = set()

    async def startup(self) -> None:
        await anyio.to_thread.run_sync(self._resolve)

    async def shutdown(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()

    def _resolve(self) -> Path:
        if self.database is None:
            self.database = build_demo_database()
        if not self.database.is_file():
            raise ToolError(f"database file {self.database} does not exist", ErrorKind.UNAVAILABLE)
        return self.database

    async def __call__(
        self,
        query: Annotated[str, "One SQL statement (SQLite dialect), e.g. SELECT * FROM some_table LIMIT 5."],
        ctx: ToolContext,
    ) -> ToolOutput:
        """Run a SQL statement; returns the rows as a table."""
        if not isinstance(query, str) or not query.strip():
            raise ToolError("query is empty; send one SQL statement", ErrorKind.INVALID_ARGUMENTS)
        if len(query) > MAX_QUERY_CHARS:
            raise ToolError(
                f"query has {len(query)} characters, over the limit {MAX_QUERY_CHARS}",
                ErrorKind.INVALID_ARGUMENTS,
            )
        source = await anyio.to_thread.run_sync(self._resolve)
        session = ctx.session if ctx is not None else None
        if session is None:
            connection = await anyio.to_thread.run_sync(
                lambda: _Connection.open(source, writable=self.writable)
            )
            try:
                return await self._run(connection, query)
            finally:
                connection.close()
        connection = await self._session_connection(session, source)
        async with connection.lock:
            return await self._run(connection, query)

    async def _session_connection(self, session: SessionState, source: Path) -> _Connection:
        connection = session.data.get(self._key)
        if connection is None:
            connection = await anyio.to_thread.run_sync(
                lambda: _Connection.open(source, writable=self.writable)
            )
            if self._key in session.data:  # a concurrent first call won the race
                connection.close()
                return session.data[self._key]
            session.data[self._key] = connection
            self._open.add(connection)

            def close() -> None:
                self._open.discard(connection)
                connection.close()

            session.on_close(close)
        return connection

    async def _run(self, connection: _Connection, query: str) -> ToolOutput:
        try:
            columns, rows, truncated, changed = await anyio.to_thread.run_sync(
                connection.execute, query, self.max_rows, self.timeout_s
            )
        except sqlite3.OperationalError as exc:
            if str(exc) == "interrupted":
                raise ToolError(
                    f"query stopped after the time limit of {self.timeout_s:g} s", ErrorKind.TIMEOUT
                ) from None
            return self._error(connection.denied or str(exc))
        except (
            sqlite3.DatabaseError,
            sqlite3.Warning,
            sqlite3.ProgrammingError,
            OverflowError,
            ValueError,
        ) as exc:
            message = str(exc)
            if "one statement at a time" in message:
                message = "only one SQL statement per call is supported"
            return self._error(connection.denied or message)
        if columns:
            text = render_table(columns, rows, truncated, self.max_cell_chars)
        else:
            text = f"OK ({changed} row{'s' if changed != 1 else ''} changed)" if changed >= 0 else "OK"
        structured = {
            "columns": columns,
            "rows": [[_json_value(v, self.max_cell_chars) for v in row] for row in rows],
            "truncated": truncated,
        }
        return ToolOutput.text(text, structured)

    @staticmethod
    def _error(message: str) -> ToolOutput:
        return ToolOutput(
            [{"type": "text", "text": f"SQL error: {message}"}], {"error": message}, is_error=True
        )
