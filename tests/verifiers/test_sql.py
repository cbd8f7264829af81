"""sql_match: real SQLite database, read-only, result-set comparison and limits."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from protocol import VerifyRequest
from tools.verifiers.sql import has_top_level_order_by, sql_match


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "shop.db"
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """
            CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT);
            CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total REAL);
            INSERT INTO customers VALUES (1, 'Ann', 'Oslo'), (2, 'Bob', 'Rome'), (3, 'Čeněk', 'Brno');
            INSERT INTO orders VALUES (1, 1, 10.5), (2, 1, 20.0), (3, 2, 5.25), (4, 3, 7.0);
            """
        )
    connection.close()
    return path


def req(response, gold, db_path, **arguments) -> VerifyRequest:
    truth = {"sql": gold, "db_path": str(db_path)} if db_path is not None else gold
    return VerifyRequest("sql_match", ground_truth=truth, response=response, arguments=arguments)


class TestMatch:
    def test_same_rows_different_order(self, db):
        result = sql_match(
            req("SELECT name FROM customers ORDER BY name DESC", "SELECT name FROM customers", db)
        )
        assert result.score == 1.0
        assert result.components == {"execution_match": 1.0, "executes": 1.0}
        assert result.details["ordered"] is False

    def test_order_matters_when_gold_orders(self, db):
        gold = "SELECT name FROM customers ORDER BY name"
        assert sql_match(req("SELECT name FROM customers ORDER BY name", gold, db)).score == 1.0
        result = sql_match(req("SELECT name FROM customers ORDER BY name DESC", gold, db))
        assert result.score == 0.0
        assert result.details["ordered"] is True

    def test_different_query_same_result(self, db):
        gold = "SELECT SUM(total) FROM orders WHERE customer_id = 1"
        predicted = "```sql\nSELECT 30.5\n```"
        assert sql_match(req(predicted, gold, db)).score == 1.0

    def test_int_and_float_agree(self, db):
        assert sql_match(req("SELECT 20", "SELECT total FROM orders WHERE id = 2", db)).score == 1.0

    def test_duplicates_count(self, db):
        gold = "SELECT customer_id FROM orders"
        assert sql_match(req("SELECT DISTINCT customer_id FROM orders", gold, db)).score == 0.0

    def test_wrong_rows(self, db):
        result = sql_match(req("SELECT name FROM customers WHERE id < 3", "SELECT name FROM customers", db))
        assert result.score == 0.0
        assert result.components["executes"] == 1.0
        assert result.details["predicted_rows"] == 2 and result.details["gold_rows"] == 3

    def test_unicode_values(self, db):
        gold = "SELECT name FROM customers WHERE city = 'Brno'"
        assert sql_match(req("<answer>SELECT 'Čeněk'</answer>", gold, db)).score == 1.0

    def test_db_path_from_arguments(self, db):
        request = VerifyRequest(
            "sql_match", ground_truth="SELECT 1", response="SELECT 1", arguments={"db_path": str(db)}
        )
        assert sql_match(request).score == 1.0

    def test_answer_tag_and_fence(self, db):
        response = "<think>count</think><answer>```sql\nSELECT COUNT(*) FROM orders;\n```</answer>"
        assert sql_match(req(response, "SELECT 4", db)).score == 1.0


class TestFailures:
    def test_bad_sql(self, db):
        result = sql_match(req("SELEC name FROM customers", "SELECT name FROM customers", db))
        assert result.score == 0.0
        assert result.components["executes"] == 0.0
        assert "predicted query failed" in result.details["error"]
        assert "syntax error" in result.details["error"]

    def test_writes_are_refused_and_nothing_changes(self, db):
        for statement in ("DELETE FROM orders", "DROP TABLE orders", "INSERT INTO orders VALUES (9, 1, 1.0)"):
            result = sql_match(req(statement, "SELECT 1", db))
            assert result.score == 0.0
            assert "predicted query failed" in result.details["error"]
        with sqlite3.connect(db) as connection:
            assert connection.execute("SELECT COUNT(*) FROM orders").fetchone() == (4,)

    def test_attach_and_pragma_are_refused(self, db, tmp_path):
        other = tmp_path / "other.db"
        sqlite3.connect(other).close()
        for statement in (f"ATTACH DATABASE '{other}' AS o", "PRAGMA table_info(orders)"):
            result = sql_match(req(statement, "SELECT 1", db))
            assert result.score == 0.0
            assert "not authorized" in result.details["error"]

    def test_two_statements(self, db):
        result = sql_match(req("SELECT 1; SELECT 2", "SELECT 1", db))
        assert result.score == 0.0
        assert "one statement" in result.details["error"]

    def test_row_limit(self, db):
        big = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 50) SELECT x FROM n"
        result = sql_match(req(big, "SELECT 1", db, max_rows=10))
        assert result.score == 0.0
        assert "more than 10 rows" in result.details["error"]

    def test_time_limit(self, db):
        endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
        result = sql_match(req(endless, "SELECT 1", db, timeout_s=0.2))
        assert result.score == 0.0
        assert "longer than 0.2s" in result.details["error"]

    def test_missing_database(self, tmp_path):
        result = sql_match(req("SELECT 1", "SELECT 1", tmp_path / "absent.db"))
        assert result.score == 0.0
        assert "does not exist" in result.details["error"]

    def test_no_database_given(self):
        result = sql_match(req("SELECT 1", "SELECT 1", None))
        assert "no database" in result.details["error"]

    def test_bad_gold_is_reported_as_data_problem(self, db):
        result = sql_match(req("SELECT 1", "SELECT nope FROM nowhere", db))
        assert result.score == 0.0
        assert "gold query failed" in result.details["error"]

    def test_empty_prediction(self, db):
        assert sql_match(req("", "SELECT 1", db)).details["error"] == "empty query"

    def test_db_root_restriction(self, db, tmp_path, monkeypatch):
        monkeypatch.setenv("TOOLFACTORY_SQL_DB_ROOT", str(tmp_path))
        result = sql_match(req("SELECT 1", "SELECT 1", db))
        assert "outside TOOLFACTORY_SQL_DB_ROOT" in result.details["error"]

    def test_blob_rows_are_reported_as_hex(self, db):
        result = sql_match(req("SELECT x'00ff'", "SELECT x'00ff'", db))
        assert result.score == 1.0
        assert result.details["sample_predicted"] == [["00ff"]]


@pytest.mark.parametrize(
    ("sql", "ordered"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order  by a", True),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)", False),
        ("SELECT 'order by' FROM t", False),
        ("SELECT a FROM t -- ORDER BY a", False),
        ("SELECT a FROM t", False),
    ],
)
def test_top_level_order_by(sql, ordered):
    assert has_top_level_order_by(sql) is ordered
