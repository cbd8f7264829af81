"""Property-based fuzzing of the HTTP API: nothing a client sends may produce a 5xx.

Two generators: schemathesis derives requests from our own /openapi.json (valid
and schema-violating bodies for every operation), and a hypothesis strategy of
arbitrary JSON documents is thrown at every POST endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.server import ServerProcess, running_server, server_config
from tool_server.api.openapi import openapi_spec

schema = schemathesis.openapi.from_dict(openapi_spec())


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    corpus = tmp / "docs.jsonl"
    corpus.write_text('{"id": "1", "title": "Fuzz", "contents": "a tiny corpus so /retrieve is served"}\n')
    config = server_config()
    config["tools"] = config["tools"] + [
        {"target": "tools.search:SearchTool", "args": {"corpus": str(corpus), "cache_dir": str(tmp)}}
    ]
    config["verifiers"] = [{"target": "tools.verifiers.match:exact_match"}]
    with running_server(config) as proc:
        yield proc


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_operations_never_5xx(case, fuzz_server):
    response = case.call(base_url=fuzz_server.url, timeout=30)
    assert response.status_code < 500, (
        f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
call_like = st.fixed_dictionaries(
    {
        "call_id": st.text(max_size=10) | st.integers(),
        "name": st.sampled_from(["echo", "calculator", "sleep", "x", ""]),
    },
    optional={"arguments": json_values, "session": json_values},
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"calls": st.lists(call_like | json_values, max_size=5)}),
    st.fixed_dictionaries({"requests": st.lists(json_values, max_size=5)}),
)


@given(body=bodies, path=st.sampled_from(["/v1/calls", "/v1/verify", "/v1/sessions", "/retrieve", "/mcp"]))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_arbitrary_json_never_5xx(fuzz_server, body, path):
    headers = {"Accept": "application/json, text/event-stream"}
    response = httpx.post(fuzz_server.url + path, json=body, headers=headers, timeout=30)
    assert response.status_code < 500, (
        f"POST {path} {body!r} -> {response.status_code}: {response.text[:300]}"
    )


@given(raw=st.binary(max_size=200), path=st.sampled_from(["/v1/calls", "/v1/verify", "/v1/sessions"]))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_arbitrary_bytes_never_5xx(fuzz_server, raw, path):
    headers = {"content-type": "application/json"}  # declared JSON: the bytes reach the parsers
    response = httpx.post(fuzz_server.url + path, content=raw, headers=headers, timeout=30)
    assert response.status_code < 500
