"""The sql tool on real SQLite files: read-only by default, private copies when writable."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from protocol import ErrorKind, SessionState, ToolError, ToolOutput, get_tool_meta
from tests.support.tool_context import Ctx
from tools.sql import SqlTool, build_demo_database, render_table


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return build_demo_database(tmp_path / "demo.sqlite")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def text(out: ToolOutput) -> str:
    return out.content[0]["text"]


async def test_demo_database_works_out_of_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFACTORY_CACHE", str(tmp_path / "cache"))
    tool = SqlTool()
    await tool.startup()
    assert tool.database == tmp_path / "cache" / "sql" / "demo-company-v1.sqlite"
    out = await tool("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", Ctx(None))
    assert text(out) == "name\n-----------\nassignments\ndepartments\nemployees\nprojects\n(4 rows)"
    assert out.structured == {
        "columns": ["name"],
        "rows": [["assignments"], ["departments"], ["employees"], ["projects"]],
        "truncated": False,
    }


async def test_select_renders_a_table(demo: Path) -> None:
    tool = SqlTool(database=str(demo))
    out = await tool(
        "SELECT d.name AS department, COUNT(*) AS people FROM employees e "
        "JOIN departments d ON d.id = e.department_id GROUP BY d.name ORDER BY people DESC, department",
        Ctx(None),
    )
    assert not out.is_error
    assert text(out).splitlines() == [
        "department  | people",
        "------------+-------",
        "Engineering | 5",
        "Research    | 4",
        "Sales       | 4",
        "Support     | 3",
        "(4 rows)",
    ]
    assert out.structured["rows"][0] == ["Engineering", 5]


def test_render_table_cells() -> None:
    table = render_table(["a", "b", "c"], [(None, b"\x00\x01", "x" * 50), (1.5, 2, "two\nlines")], False, 10)
    assert table.splitlines() == [
        "a    | b              | c",
        "-----+----------------+-----------",
        "NULL | <blob 2 bytes> | xxxxxxxxx…",
        "1.5  | 2              | two\\nlines",
        "(2 rows)",
    ]


@pytest.mark.parametrize(
    ("query", "needs"),
    [
        ("INSERT INTO departments VALUES (9, 'Legal', 'Oslo')", "INSERT"),
        ("UPDATE employees SET salary = 0", "UPDATE"),
        ("DELETE FROM employees", "DELETE"),
        ("DROP TABLE employees", "a schema change"),
        ("CREATE TABLE t (x)", "a schema change"),
        ("BEGIN", "TRANSACTION"),
    ],
)
async def test_read_only_is_enforced(demo: Path, query: str, needs: str) -> None:
    before = digest(demo)
    out = await SqlTool(database=str(demo))(query, Ctx(SessionState("s-ro")))
    assert out.is_error
    assert (
        text(out)
        == f"SQL error: the database is read-only: only statements that read are allowed (this one needs {needs})"
    )
    assert digest(demo) == before


@pytest.mark.parametrize("writable", [False, True])
async def test_files_outside_the_database_are_out_of_reach(
    demo: Path, tmp_path: Path, writable: bool
) -> None:
    tool = SqlTool(database=str(demo), writable=writable)
    for query in (f"ATTACH DATABASE '{tmp_path}/other.db' AS other", f"VACUUM INTO '{tmp_path}/copy.db'"):
        out = await tool(query, Ctx(None))
        assert out.is_error and "ATTACH and DETACH (and VACUUM INTO) are not allowed" in text(out)
    assert not (tmp_path / "other.db").exists() and not (tmp_path / "copy.db").exists()
    pragma = await tool("PRAGMA journal_mode = OFF", Ctx(None))
    assert pragma.is_error and "PRAGMA journal_mode is not allowed" in text(pragma)
    ext = await tool("SELECT load_extension('/tmp/x.so')", Ctx(None))
    assert ext.is_error and "load_extension() is not allowed" in text(ext)
    info = await tool("PRAGMA table_info(departments)", Ctx(None))
    assert [row[1] for row in info.structured["rows"]] == ["id", "name", "city"]


async def test_row_limit(demo: Path) -> None:
    tool = SqlTool(database=str(demo), max_rows=3)
    out = await tool("SELECT id, name FROM employees ORDER BY id", Ctx(None))
    assert out.structured["truncated"] is True
    assert [row[0] for row in out.structured["rows"]] == [1, 2, 3]
    assert text(out).endswith("(3 rows shown; more rows were cut: add LIMIT or narrow the query)")
    exact = await tool("SELECT id FROM employees WHERE id <= 3", Ctx(None))
    assert exact.structured["truncated"] is False and len(exact.structured["rows"]) == 3


async def test_writable_sessions_get_private_copies(demo: Path) -> None:
    before = digest(demo)
    tool = SqlTool(database=str(demo), writable=True)
    one, two = SessionState("s-one"), SessionState("s-two")
    assert (
        text(await tool("INSERT INTO departments VALUES (9, 'Legal', 'Oslo')", Ctx(one)))
        == "OK (1 row changed)"
    )
    assert text(await tool("CREATE TABLE notes (body TEXT)", Ctx(one))) == "OK"
    count = "SELECT COUNT(*) FROM departments"
    assert (await tool(count, Ctx(one))).structured["rows"] == [[5]]
    assert (await tool(count, Ctx(two))).structured["rows"] == [[4]]
    missing = await tool("SELECT * FROM notes", Ctx(two))
    assert missing.is_error and "no such table: notes" in text(missing)
    copy = one.data[tool._key].copy_dir
    assert copy is not None and os.path.isdir(copy)
    await one.close()
    assert not os.path.exists(copy)  # the session's copy is deleted with it
    await two.close()
    assert digest(demo) == before
    assert (await tool(count, Ctx(None))).structured["rows"] == [[4]]


async def test_time_limit(demo: Path) -> None:
    tool = SqlTool(database=str(demo), timeout_s=0.3)
    session = SessionState("s-slow")
    with pytest.raises(ToolError) as info:
        await tool(
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r",
            Ctx(session),
        )
    assert info.value.kind is ErrorKind.TIMEOUT
    assert info.value.message == "query stopped after the time limit of 0.3 s"
    assert (await tool("SELECT COUNT(*) FROM employees", Ctx(session))).structured["rows"] == [[16]]
    await session.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT 1; SELECT 2", "SQL error: only one SQL statement per call is supported"),
        ("SELEC 1", 'SQL error: near "SELEC": syntax error'),
        ("SELECT * FROM nowhere", "SQL error: no such table: nowhere"),
        ("SELECT zeroblob(100000000)", "SQL error: string or blob too big"),
    ],
)
async def test_sql_errors_are_results_the_model_can_read(demo: Path, query: str, message: str) -> None:
    out = await SqlTool(database=str(demo))(query, Ctx(None))
    assert out.is_error and text(out) == message


async def test_bad_arguments_and_missing_database(tmp_path: Path, demo: Path) -> None:
    with pytest.raises(ToolError) as info:
        await SqlTool(database=str(demo))("   ", Ctx(None))
    assert info.value.kind is ErrorKind.INVALID_ARGUMENTS
    with pytest.raises(ToolError) as info:
        await SqlTool(database=str(tmp_path / "none.sqlite"))("SELECT 1", Ctx(None))
    assert info.value.kind is ErrorKind.UNAVAILABLE and "does not exist" in info.value.message


async def test_custom_database(tmp_path: Path) -> None:
    path = tmp_path / "custom.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE cities (name TEXT, population INTEGER)")
        conn.executemany("INSERT INTO cities VALUES (?, ?)", [("Oslo", 709000), ("Bergen", 291000)])
    conn.close()
    out = await SqlTool(database=str(path))("SELECT name FROM cities WHERE population > 500000", Ctx(None))
    assert out.structured["rows"] == [["Oslo"]]


def test_metadata() -> None:
    meta = get_tool_meta(SqlTool)
    assert (meta.name, meta.stateful) == ("sql", True)
