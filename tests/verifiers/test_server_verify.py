"""The built-in verifiers served by a real tool server on loopback: POST /v1/verify.

Checks what only the server shows: each verifier registers (its signature, the injected
ToolContext), scores over HTTP in one batch, and the judge's fallback works with the
server's real context when no ``llm`` tool is configured.
"""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from tests.support.server import running_server, server_config
from tools.verifiers import BUILTIN_VERIFIERS


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    verifiers = [{"target": f"{fn.__module__}:{fn.__name__}"} for fn in BUILTIN_VERIFIERS.values()]
    with running_server(server_config(verifiers=verifiers)) as process:
        yield process


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "t.db"
    with sqlite3.connect(path) as connection:
        connection.executescript("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2), (3);")
    connection.close()
    return str(path)


def verify(server, requests: list[dict]) -> list[dict]:
    response = httpx.post(f"{server.url}/v1/verify", json={"requests": requests}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_batch_of_every_verifier(server, db):
    tests = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"
    requests = [
        {
            "verifier": "exact_match",
            "response": "<answer>Paris</answer>",
            "ground_truth": {"target": ["Paris"]},
        },
        {"verifier": "f1", "response": "<answer>Paris France</answer>", "ground_truth": "Paris"},
        {"verifier": "math_equal", "response": "<answer>\\frac{1}{2}</answer>", "ground_truth": "0.5"},
        {"verifier": "format", "response": "<think>x</think><answer>y</answer>"},
        {
            "verifier": "sql_match",
            "response": "SELECT 6",
            "ground_truth": {"sql": "SELECT SUM(x) FROM t", "db_path": db},
        },
        {
            "verifier": "code_tests",
            "response": "```python\ndef double(x):\n    return 2 * x\n```",
            "ground_truth": {"tests": tests, "entry_point": "double"},
        },
        {
            "verifier": "weighted",
            "response": "<answer>Paris</answer>",
            "ground_truth": "Paris",
            "arguments": {"verifiers": {"exact_match": 0.9, "format": 0.1}},
        },
        {
            "verifier": "exact_match",
            "response": "<answer>Lyon</answer>",
            "ground_truth": "Paris",
            "request_id": "r-8",
        },
    ]
    results = verify(server, requests)
    scores = [r["score"] for r in results]
    assert scores == pytest.approx([1.0, 2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    assert not any(r["is_error"] for r in results)
    assert results[0]["components"] == {"exact_match": 1.0}
    assert results[5]["details"]["passed"] == 2
    assert results[6]["components"]["format"] == 1.0
    assert results[7]["request_id"] == "r-8"


def test_judge_falls_back_through_the_real_context(server):
    # No "llm" tool is configured: ctx.call returns an unknown_tool error result.
    (result,) = verify(
        server,
        [
            {
                "verifier": "judge",
                "response": "<answer>Paris</answer>",
                "ground_truth": "Paris",
                "arguments": {"fallback_score": 0.5},
            }
        ],
    )
    assert result["score"] == 0.5
    assert result["details"]["judge_error"].startswith("'llm' returned an error:")


def test_verifiers_are_listed_as_mcp_style_tools(server):
    response = httpx.get(f"{server.url}/v1/tools", params={"toolset": "verifiers"}, timeout=10)
    assert response.status_code == 200, response.text
    names = {tool["name"] for tool in response.json()["tools"]}
    assert {f"verify_{name}" for name in BUILTIN_VERIFIERS} <= names


def test_response_start_keeps_worked_examples_out_of_the_score(server):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>'
    examples = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "<answer>6</answer>"},
    ]
    chat = [
        *examples,
        {"role": "user", "content": "What is 7 * 8?"},
        {"role": "assistant", "content": "<answer>56</answer>"},
    ]
    request = {"verifier": "format", "messages": chat, "arguments": {"min_calls": 1}}
    whole, rollout_only = verify(server, [request, {**request, "response_start": 5}])
    assert whole["details"]["tool_calls"] == 1  # the example's call, read as the model's
    assert rollout_only["details"]["tool_calls"] == 0
    assert rollout_only["components"]["tool_call_count"] < whole["components"]["tool_call_count"]
    # Through the weighted verifier the boundary reaches every part.
    weighted = {"verifier": "weighted", "messages": chat, "ground_truth": "56", "response_start": 5}
    weighted["arguments"] = {
        "verifiers": {"math_equal": 1.0, "format": 1.0},
        "arguments": {"format": {"min_calls": 1}},
    }
    (result,) = verify(server, [weighted])
    assert result["components"]["math_equal"] == 1.0
    assert result["details"]["format"]["tool_calls"] == 0


@pytest.mark.parametrize(
    ("response_start", "message"),
    [(-1, "non-negative integer"), ("2", "non-negative integer"), (9, "past the end of messages")],
)
def test_bad_response_start_is_a_clear_400(server, response_start, message):
    request = {
        "verifier": "format",
        "messages": [{"role": "user", "content": "q"}],
        "response_start": response_start,
    }
    response = httpx.post(f"{server.url}/v1/verify", json={"requests": [request]}, timeout=30)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
