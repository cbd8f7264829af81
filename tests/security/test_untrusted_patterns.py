"""Regular expressions from outside never block the server (nor the reward, nor the builder).

JSON Schema ``pattern`` and ``patternProperties`` come from upstream MCP servers and from
model-built packs. Before, jsonschema ran them with Python's ``re``, which backtracks:
``^(a+)+$`` against 27 characters stalled the whole event loop (health checks included)
for 10 s, doubling with each more character, and 10,000 characters never end. Now they
run on RE2, whose time is linear in the input, and a pattern RE2 cannot run (lookaround,
backreferences) is refused up front: the upstream tool is not served (``/readyz`` and the
log say why), a built pack's tool is rejected by the gate, a pack's schema is a config error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from protocol import Result, decode_results
from tests.server.upstream.test_served import wait_for
from tests.support.server import REPO, running_server, server_config
from tool_server.config import ConfigError
from tool_server.upstream.tools import schema_validator
from tools.patterns import UnsafePattern, compile_pattern, linear_validator

PATTERNS = str(Path(__file__).resolve().parents[1] / "support" / "pattern_upstream.py")
LONG_PATTERNS = str(Path(__file__).resolve().parents[1] / "support" / "long_pattern_upstream.py")
EVIL = "a" * 10_000 + "!"  # ^(a+)+$ against this: 2^10000 steps for a backtracking engine

pytestmark = pytest.mark.timeout(300)


def call(url: str, name: str, arguments: dict[str, Any]) -> Result:
    body = {"calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}]}
    response = httpx.post(url + "/v1/calls", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def test_hostile_upstream_patterns_are_checked_in_linear_time_and_never_stall_the_server() -> None:
    config = server_config(mcpServers={"patterns": {"command": sys.executable, "args": [PATTERNS]}})
    with running_server(config) as srv:
        status = lambda: httpx.get(srv.url + "/readyz").json()["checks"]["upstream:patterns"]  # noqa: E731
        wait_for(lambda: status()["healthy"], 60)

        # Hostile arguments (and a hostile result), sent at once; the server answers its health
        # check meanwhile. Before: the first of them held the event loop for good, /healthz timed out.
        hostile = [
            ("patterns__code", {"value": EVIL}),
            ("patterns__tagged", {"labels": {"x" * 10_000 + "!": 1}}),
            ("patterns__word", {"n": 10_000}),  # its result, against its own outputSchema
        ] * 2
        with ThreadPoolExecutor(len(hostile)) as pool:
            pending = [pool.submit(call, srv.url, name, arguments) for name, arguments in hostile]
            for _ in range(20):  # while they arrive and are checked
                assert httpx.get(srv.url + "/healthz", timeout=60).status_code == 200
                time.sleep(0.05)
            results = [future.result(timeout=180) for future in pending]
        kinds = [r.error.kind if r.error else None for r in results]
        assert kinds == ["invalid_arguments", "invalid_arguments", "tool_error"] * 2, results
        assert "does not match '^(a+)+$'" in results[0].error.message
        assert "unexpected argument 'labels.xxxxxxxx" in results[1].error.message  # matched no pattern
        assert "Invalid structured content returned by tool word" in results[2].error.message

        # Lookaheads RE2 cannot run: those tools alone are not served, and the operator is told why.
        ahead, peek = sorted(status()["refused_tools"])
        assert ahead.startswith(
            "tool 'patterns__ahead': its inputSchema: pattern '^(?=a)a+$' cannot run on RE2"
        )
        assert peek.startswith("tool 'patterns__peek': its outputSchema: pattern '^(?=a)' cannot run on RE2")
        assert "disabledTools" in ahead and ahead in srv.output and peek in srv.output
        served = {tool["name"] for tool in httpx.get(srv.url + "/v1/tools").json()["tools"]}
        assert served >= {"patterns__code", "patterns__tagged", "patterns__word"}
        assert not served & {"patterns__ahead", "patterns__peek"}

        # What matches still goes through, checked by the same engine.
        assert call(srv.url, "patterns__code", {"value": "a" * 10_000}).structured == {"result": 10_000}
        assert call(srv.url, "patterns__tagged", {"labels": {"xx": 1, "x": 2}}).structured == {"result": 2}


async def test_long_upstream_patterns_are_refused_and_checked_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: jsonschema's check_schema compiled each pattern with ``re`` on the event loop
    # (seconds per 1.4 MB pattern, 69.7 s for six in the attack); nothing else ran meanwhile.
    from tool_server.upstream import tools as upstream_tools
    from tool_server.upstream.hosting import UpstreamServer

    on_the_loop: list[bool] = []  # per schema check: was it on the event loop's thread?
    from tools.patterns import check_schema as real_check

    def check_schema(schema: Any, *more: Any) -> None:
        on_the_loop.append(threading.current_thread() is threading.main_thread())
        real_check(schema, *more)

    monkeypatch.setattr(upstream_tools, "check_schema", check_schema, raising=False)
    assert threading.current_thread() is threading.main_thread()  # where this test's loop runs

    longest_gap = 0.0  # the longest the event loop went without running this ticker

    async def tick() -> None:
        nonlocal longest_gap
        last = time.monotonic()
        while True:
            await anyio.sleep(0.05)
            longest_gap = max(longest_gap, time.monotonic() - last)
            last = time.monotonic()

    up = UpstreamServer("long", {"command": sys.executable, "args": [LONG_PATTERNS]}, connect_timeout_s=60)
    async with anyio.create_task_group() as ticker:
        ticker.start_soon(tick)
        try:
            await up.start()
            assert up.healthy, up.last_error
            refused = sorted(up.status()["refused_tools"])
            assert [why.split("'")[1] for why in refused] == [
                f"long__long_{kind}_{n}" for kind in ("input", "key", "output") for n in (1, 2)
            ]
            assert all("is 1,399,999 characters long, over the 4,096 allowed" in why for why in refused)
            assert [tool.name for tool in up.catalog] == ["long__short"]

            # The served tool's patterns still hold, in and out (its output check was built
            # with the catalog, off the loop).
            assert (await up.call("short", {"word": "abc"})).structured == {"value": "abc"}
            wrong = await up.call("short", {"word": "ab1"})
            assert wrong.error is not None and "does not match '^[a-z]+$'" in wrong.error.message
        finally:
            await up.stop()
            ticker.cancel_scope.cancel()
    assert on_the_loop and not any(on_the_loop), "every schema is checked in a worker thread"
    assert longest_gap < 10, f"the event loop was held {longest_gap:.1f} s"  # generous: blocked, not slow


def test_a_pattern_over_the_length_bound_is_refused_before_any_engine_sees_it() -> None:
    from tools.patterns import MAX_PATTERN_CHARS, check_schema

    check_schema({"pattern": "a" * MAX_PATTERN_CHARS, "patternProperties": {"b" * MAX_PATTERN_CHARS: {}}})
    for schema in (
        {"pattern": "a" * (MAX_PATTERN_CHARS + 1)},
        {"patternProperties": {"b" * (MAX_PATTERN_CHARS + 1): {}}},
        {"$defs": {"x": {"items": [{"pattern": "(" * 5000 + ")" * 5000}]}}},
    ):
        with pytest.raises(UnsafePattern, match="characters long, over the 4,096 allowed"):
            check_schema(schema)
        with pytest.raises(UnsafePattern):
            linear_validator(schema)


def test_the_schema_validator_runs_patterns_on_re2() -> None:
    assert type(compile_pattern("^(a+)+$")).__module__.startswith("re2")
    # In a fresh interpreter: were the backtracking engine back, only that process would hang.
    found = _in_a_subprocess(
        "import json\n"
        "from tool_server.upstream.tools import schema_validator\n"
        "from tools.patterns import linear_validator\n"
        "schema = {'type': 'object', 'properties': {'code': {'type': 'string', 'pattern': '^(a+)+$'}},\n"
        "    'patternProperties': {'^(b+)+$': {'type': 'integer'}}, 'additionalProperties': False}\n"
        "bad = {'code': 'a' * 100_000 + '!', 'b' * 100_000 + '!': 1}\n"
        "messages = sorted(e.message[-50:] for e in linear_validator(schema).iter_errors(bad))\n"
        "check = schema_validator('t', schema)\n"
        "try:\n"
        "    check({'code': 'a' * 100_000 + '!'})\n"
        "except ValueError as exc:\n"
        "    refused = str(exc)[-30:]\n"
        "print(json.dumps([messages, refused, check({'code': 'a', 'b': 3})]))\n"
    )
    assert found == [
        [
            "aaaaaaaaaaaaaaaaaaaaaaa!' does not match '^(a+)+$'",
            "bbb!' does not match any of the regexes: '^(b+)+$'",
        ],
        "aaa!' does not match '^(a+)+$'",
        {"code": "a", "b": 3},
    ]


def test_a_remote_ref_in_a_schema_is_never_fetched() -> None:
    # jsonschema's default registry fetched a remote $ref with urllib, blocking, wherever the
    # schema's author pointed it (an internal address, a slow host): SSRF and a stalled loop.
    fetched: list[str] = []

    class Schemas(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            body = json.dumps({"type": "string", "maxLength": 3}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Schemas)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/schema.json"
        check = schema_validator("t", {"type": "object", "properties": {"v": {"$ref": url}}})
        # Unresolvable here: the argument passes unchecked (and the log says so); the upstream
        # checks its own. Before: fetched, then "'long' is too long".
        assert check({"v": "long"}) == {"v": "long"}
        assert fetched == []
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "string", "pattern": "^(?=a)a+$"}, "invalid perl operator: (?="),
        ({"type": "string", "pattern": "(a)\\1"}, "invalid escape sequence: \\1"),
        ({"patternProperties": {"(?<!x)y": {}}}, "invalid perl operator: (?<"),
        ({"$defs": {"deep": {"pattern": "a\\Z"}}, "$ref": "#/$defs/deep"}, "invalid escape sequence: \\Z"),
        ({"patternProperties": {"^a": {}}, "unevaluatedProperties": False}, "use additionalProperties"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_with_the_reason(schema: dict[str, Any], needle: str) -> None:
    with pytest.raises(UnsafePattern) as refused:
        linear_validator(schema)
    assert needle in str(refused.value)
    # A pack's tool with such a schema: a configuration error that names the tool (the server
    # would not start with it), never arguments checked by the backtracking engine.
    with pytest.raises(ConfigError, match=r"^tool 'shop__find': its inputSchema: "):
        schema_validator("shop__find", {"type": "object", "properties": {"q": schema}})


def _in_a_subprocess(code: str) -> Any:
    """Run ``code`` (it prints JSON) in a fresh interpreter: a backtracking regex there stalls
    only that process, which the timeout ends, instead of this test run."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout)


def test_the_tool_use_reward_checks_hostile_patterns_in_linear_time() -> None:
    # The reward's schema check (tools/verifiers/tool_use/schema.py) sees the pack's schema
    # and the policy's arguments: both untrusted. Before: re, 2^10000 steps for one call.
    verdicts = _in_a_subprocess(
        "import json\n"
        "from tools.verifiers.tool_use.schema import compile_schema, schema_problem\n"
        "schema = {'type': 'object', 'properties': {'v': {'type': 'string', 'pattern': '^(a+)+$'}}}\n"
        "lookahead = {'type': 'object', 'properties': {'v': {'type': 'string', 'pattern': '(?=a)'}}}\n"
        f"evil = {{'v': {EVIL!r}}}\n"
        "print(json.dumps([compile_schema(schema)(evil), schema_problem(schema, evil)[-28:],\n"
        "    compile_schema(schema)({'v': 'aaa'}), compile_schema(lookahead)({'v': 'a'}),\n"
        "    schema_problem(lookahead, {'v': 'a'})]))\n"
    )
    assert verdicts[:3] == [False, "a!' does not match '^(a+)+$'", True]
    assert verdicts[3] is False
    assert verdicts[4].startswith(
        "the tool's input schema cannot be checked: pattern '(?=a)' cannot run on RE2"
    )


def test_the_builders_gate_rejects_a_tool_whose_pattern_re2_cannot_run() -> None:
    from tools.envs.builder.gate import GateResult, check_tools
    from tools.envs.builder.loader import assemble_source, built_tools
    from tools.envs.builder.sandboxed import SandboxExecutor
    from tools.envs.pack import Pack, PackInfo

    sources = {
        "find": "def find(world, key):\n    return world['items'].get(key)",
        "ahead": "def ahead(world, key):\n    return key",
    }
    docs = [
        {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {"key": {"type": "string", "pattern": pattern}}},
            "reads": ["items"],
            "writes": [],
        }
        for name, pattern in (("find", "^[a-z]+$"), ("ahead", "^(?!admin)[a-z]+$"))
    ]
    with SandboxExecutor() as executor:
        source = assemble_source(sources)
        draft = Pack(
            PackInfo("patterns"), built_tools(docs, source, executor), {"items": {}}, [], trusted=False
        )
        result = GateResult()
        check_tools(draft, source, executor, result)
    assert result.rejected_tools == {"ahead"}
    (rejection,) = result.tools.rejected
    assert rejection["candidate"] == "ahead"
    assert rejection["reason"].startswith("input schema: pattern '^(?!admin)[a-z]+$' cannot run on RE2")
