"""The batched HTTP API against a real server: results, errors, idempotency, sessions, limits."""

from __future__ import annotations

import uuid

import httpx
import pytest

from protocol import decode_results


def ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def post_calls(server, calls, **kw) -> httpx.Response:
    return httpx.post(server.url + "/v1/calls", json={"calls": calls}, timeout=30, **kw)


def test_batch_mixed_success_error_and_timeout_each_independent(server):
    a, b, c, d, e, f = ids(6)
    calls = [
        {"call_id": a, "name": "calculator", "arguments": {"expression": "12*(3+4)"}},
        {"call_id": b, "name": "fail", "arguments": {"message": "kaput"}},
        {"call_id": c, "name": "sleep", "arguments": {"seconds": 0.2}},
        {"call_id": d, "name": "no_such_tool", "arguments": {}},
        {"call_id": e, "name": "calculator", "arguments": {"expr": "1"}},
        {"call_id": f, "name": "echo", "arguments": {"text": "still fine"}},
    ]
    response = post_calls(server, calls)
    assert response.status_code == 200
    results = decode_results(response.content)
    assert [r.call_id for r in results] == [a, b, c, d, e, f]
    assert results[0].structured == {"expression": "12*(3+4)", "result": 84} and not results[0].is_error
    assert (
        results[1].is_error and results[1].error.kind == "tool_error" and "kaput" in results[1].error.message
    )
    assert results[2].structured == {"slept": 0.2}
    assert results[3].error.kind == "unknown_tool" and "calculator" in results[3].error.message
    assert results[4].error.kind == "invalid_arguments"
    assert "unexpected argument 'expr'" in results[4].error.message
    assert "missing required argument 'expression'" in results[4].error.message
    assert results[5].structured["text"] == "still fine"


def test_timeout_is_a_result_and_other_calls_succeed(tmp_path):
    from tests.support.server import running_server, server_config

    config = server_config()
    config["tools"] = [
        {"target": "tools.testing:sleep", "toolsets": ["test"], "timeout_s": 0.3},
        {"target": "tools.testing:echo", "toolsets": ["test"]},
    ]
    with running_server(config) as srv:
        a, b = ids(2)
        response = post_calls(
            srv,
            [
                {"call_id": a, "name": "sleep", "arguments": {"seconds": 30}},
                {"call_id": b, "name": "echo", "arguments": {"text": "ok"}},
            ],
        )
        results = decode_results(response.content)
        assert results[0].error.kind == "timeout" and "0.3 s" in results[0].error.message
        assert results[1].structured["text"] == "ok"
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'toolfactory_calls_total{outcome="timeout",tool="sleep"} 1.0' in metrics


def test_retried_call_id_does_not_run_the_tool_twice(server):
    key = uuid.uuid4().hex
    call_id = uuid.uuid4().hex
    call = {"call_id": call_id, "name": "count", "arguments": {"key": key}}
    first = decode_results(post_calls(server, [call]).content)[0]
    again = decode_results(post_calls(server, [call, call]).content)
    assert first.structured["count"] == 1
    assert [r.structured["count"] for r in again] == [1, 1]
    # A fresh call_id does run it again: the counter proves how often the tool executed.
    fresh = decode_results(post_calls(server, [{**call, "call_id": uuid.uuid4().hex}]).content)[0]
    assert fresh.structured["count"] == 2


def test_duplicate_call_ids_in_flight_share_one_execution(server):
    key = uuid.uuid4().hex
    call_id = uuid.uuid4().hex
    calls = [{"call_id": call_id, "name": "count", "arguments": {"key": key}}] * 5
    results = decode_results(post_calls(server, calls).content)
    assert {r.structured["count"] for r in results} == {1}


def test_call_id_reused_for_another_tool_is_rejected(server):
    call_id = uuid.uuid4().hex
    post_calls(server, [{"call_id": call_id, "name": "echo", "arguments": {}}])
    result = decode_results(
        post_calls(
            server, [{"call_id": call_id, "name": "calculator", "arguments": {"expression": "1"}}]
        ).content
    )[0]
    assert result.error.kind == "bad_request" and "already used" in result.error.message


def test_cacheable_tool_is_answered_from_cache(server):
    expression = f"{uuid.uuid4().int % 10**6} * 7"
    calls = [{"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": expression}}]
    first = decode_results(post_calls(server, calls).content)[0]
    calls[0]["call_id"] = uuid.uuid4().hex
    second = decode_results(post_calls(server, calls).content)[0]
    assert not first.cached and second.cached
    assert first.structured == second.structured


def test_output_is_truncated_with_a_visible_marker(server):
    result = decode_results(
        post_calls(
            server, [{"call_id": uuid.uuid4().hex, "name": "big_output", "arguments": {"chars": 5000}}]
        ).content
    )[0]
    text = result.content[0]["text"]
    assert text.startswith("x" * 1000)
    assert "[output truncated: 4000 of 5000 characters omitted]" in text


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", 'with a "calls" list'),
        (b'{"calls": 3}', '"calls" must be a list'),
        (b'{"calls": [1]}', "calls[0] must be an object"),
        (b'{"calls": [{"name": "echo"}]}', "calls[0].call_id is missing"),
        (b'{"calls": [{"call_id": "a", "name": ""}]}', "calls[0].name must be a non-empty string"),
        (b'{"calls": [{"call_id": "a", "name": "echo", "arguments": [1]}]}', "arguments must be an object"),
        (b'{"calls": [{"call_id": 5, "name": "echo"}]}', "call_id must be a non-empty string"),
        (
            b'{"calls": [{"call_id": "a", "name": "echo", "session": 7}]}',
            "session must be a non-empty string",
        ),
    ],
)
def test_malformed_batches_get_400_with_a_clear_message(server, body, needle):
    response = httpx.post(
        server.url + "/v1/calls", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["kind"] == "bad_request" and needle in error["message"]


def test_oversized_body_gets_413(tmp_path):
    from tests.support.server import running_server, server_config

    with running_server(server_config(limits={"max_request_bytes": 2000, "max_calls_per_batch": 3})) as srv:
        big = {"calls": [{"call_id": "a", "name": "echo", "arguments": {"text": "y" * 5000}}]}
        response = httpx.post(srv.url + "/v1/calls", json=big)
        assert response.status_code == 413 and response.json()["error"]["kind"] == "too_large"

        def chunks():
            yield b'{"calls": ['
            for _ in range(100):
                yield b'{"call_id": "a", "name": "echo"},'
            yield b"]}"

        streamed = httpx.post(
            srv.url + "/v1/calls", content=chunks(), headers={"content-type": "application/json"}
        )  # no Content-Length: counted as it streams
        assert streamed.status_code == 413
        many = {"calls": [{"call_id": str(i), "name": "echo"} for i in range(4)]}
        response = httpx.post(srv.url + "/v1/calls", json=many)
        assert response.status_code == 413 and "limit is 3" in response.json()["error"]["message"]


def test_body_longer_than_its_content_length_is_cut_at_the_declared_length(server):
    """The body limit trusts Content-Length because the server reads exactly that many bytes."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(server.url)
    body = b'{"calls": []}' + b" " * 50_000
    head = f"POST /v1/calls HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"Content-Length: 5\r\nConnection: close\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"400"  # the app saw the 5 declared bytes only: '{"cal'
    assert b"not valid JSON" in rest


def test_tools_listing_and_toolsets(server):
    default = httpx.get(server.url + "/v1/tools").json()
    assert [t["name"] for t in default["tools"]] == ["calculator"]
    tool = default["tools"][0]
    assert tool["inputSchema"]["required"] == ["expression"]
    assert tool["_meta"]["toolfactory"]["cacheable"] is True
    test = httpx.get(server.url + "/v1/tools", params={"toolset": "test"}).json()
    assert {"echo", "sleep", "count", "fail"} <= {t["name"] for t in test["tools"]}
    everything = httpx.get(server.url + "/v1/tools", params={"toolset": "*"}).json()
    assert len(everything["tools"]) > len(test["tools"])
    missing = httpx.get(server.url + "/v1/tools", params={"toolset": "nope"})
    assert missing.status_code == 404 and "known toolsets" in missing.json()["error"]["message"]


def test_sessions_create_release_and_unknown(server):
    created = httpx.post(server.url + "/v1/sessions", headers={"content-type": "application/json"})  # no body
    assert created.status_code == 201
    session = created.json()["session"]
    named = httpx.post(server.url + "/v1/sessions", json={"session": "traj-42"}).json()
    assert named["session"] == "traj-42"
    assert httpx.delete(f"{server.url}/v1/sessions/{session}").status_code == 200
    gone = httpx.delete(f"{server.url}/v1/sessions/{session}")
    assert gone.status_code == 404 and gone.json()["error"]["kind"] == "unknown_session"
    bad = httpx.post(
        server.url + "/v1/sessions", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400


def test_health_ready_metrics_openapi(server):
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(server.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    post_calls(server, [{"call_id": uuid.uuid4().hex, "name": "echo", "arguments": {"text": "m"}}])
    metrics = httpx.get(server.url + "/metrics").text
    for name in (
        "toolfactory_calls_total",
        "toolfactory_call_seconds_bucket",
        "toolfactory_calls_in_flight",
        "toolfactory_queue_depth",
        "toolfactory_sessions",
        "toolfactory_batch_size",
    ):
        assert name in metrics
    assert 'toolfactory_calls_total{outcome="ok",tool="echo"}' in metrics
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/v1/calls", "/v1/verify", "/v1/tools", "/v1/sessions"} <= set(spec["paths"])


def test_wrong_method_and_path_are_4xx(server):
    assert httpx.get(server.url + "/v1/calls").status_code == 405
    assert httpx.get(server.url + "/nowhere").status_code == 404
