"""ToolClient, McpToolClient and SyncToolClient against real servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from protocol import Call, ErrorKind, VerifyRequest, new_call_id, new_session_id
from tests.support.server import running_server, server_config
from trainer_client.client.mcp import McpToolClient
from trainer_client.client.records import declares_idempotent as _declares_idempotent
from trainer_client.client.sync import SyncToolClient
from trainer_client.client.tool_client import ToolClient


def server_metric(base_url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample on the server's /metrics, filtered by labels."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def free_port_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server() -> str:
    with running_server() as proc:
        yield proc.url


def echo_call(i: int, session: str | None = None) -> Call:
    return Call(new_call_id(), "echo", {"text": f"t{i}"}, session)


async def test_concurrent_calls_are_coalesced_into_few_posts(server: str) -> None:
    before = server_metric(server, "toolfactory_batches_total", endpoint="calls")
    # No per-call split POSTs (they start after 50 ms, which a loaded machine reaches): this
    # test counts the batch POSTs only.
    async with ToolClient(server, batch_window_ms=20, split_after_ms=0) as client:
        results = await asyncio.gather(*(client.call_tools([echo_call(i)]) for i in range(300)))
        metrics = client.metrics()
    assert [r[0].structured["text"] for r in results] == [f"t{i}" for i in range(300)]
    assert not any(r[0].is_error for r in results)
    assert metrics["calls"] == 300
    assert metrics["batches"] <= 4, metrics  # 300 calls in one window: ceil(300 / 256) POSTs
    assert metrics["mean_batch_size"] >= 75
    posts = server_metric(server, "toolfactory_batches_total", endpoint="calls") - before
    assert posts == metrics["batches"]


async def test_results_keep_order_and_errors_stay_per_call(server: str) -> None:
    calls = [
        echo_call(0),
        Call(new_call_id(), "no_such_tool", {}),
        Call(new_call_id(), "calculator", {"expression": "6*7"}),
        Call(new_call_id(), "sleep", {"seconds": "not a number"}),
    ]
    async with ToolClient(server) as client:
        results = await client.call_tools(calls)
        metrics = client.metrics()
    assert [r.call_id for r in results] == [c.call_id for c in calls]
    assert results[0].structured["text"] == "t0"
    assert results[1].error.kind == ErrorKind.UNKNOWN_TOOL
    assert "42" in results[2].text
    assert results[3].error.kind == ErrorKind.INVALID_ARGUMENTS
    assert metrics["result_errors"] == {"unknown_tool": 1, "invalid_arguments": 1}


async def test_4096_concurrent_calls_without_errors(server: str) -> None:
    async with ToolClient(server) as client:
        results = await asyncio.gather(*(client.call_tools([echo_call(i)]) for i in range(4096)))
        metrics = client.metrics()
    assert sum(r[0].is_error for r in results) == 0
    assert {r[0].structured["text"] for r in results} == {f"t{i}" for i in range(4096)}
    assert metrics["errors"] == {} and metrics["result_errors"] == {}
    assert metrics["batches"] < 4096 / 8


async def test_retry_after_a_lost_answer_reuses_the_call_id(server: str) -> None:
    """The first POST times out client-side while the tool runs; the retry joins that run."""
    before = server_metric(server, "toolfactory_calls_total", tool="sleep")
    call = Call(new_call_id(), "sleep", {"seconds": 0.8})
    async with ToolClient(server, request_timeout_s=0.25, backoff_s=0.05, max_retries=10) as client:
        (result,) = await client.call_tools([call])
        metrics = client.metrics()
    assert not result.is_error, result
    assert result.call_id == call.call_id
    assert metrics["errors"].get("request_timeout", 0) >= 1
    assert metrics["retries"] >= 1
    assert server_metric(server, "toolfactory_calls_total", tool="sleep") - before == 1


async def test_a_slow_call_does_not_hold_back_a_fast_one_in_its_batch(server: str) -> None:
    before = server_metric(server, "toolfactory_calls_total", tool="sleep")
    async with ToolClient(server, split_after_ms=200) as client:
        # A batch answered in time first: a replica the client knows nothing of gets no splits.
        await client.call_tools([echo_call(0), echo_call(1)])
        # Started in the same event-loop pass, so both calls share one POST.
        slow = asyncio.create_task(client.call("sleep", {"seconds": 1.5}))
        fast = asyncio.create_task(client.call("sleep", {"seconds": 0.05}))
        done, _ = await asyncio.wait({slow, fast}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {fast} and not slow.done()
        assert not (await slow).is_error and not fast.result().is_error
        metrics = client.metrics()
    assert metrics["batches"] == 2 and metrics["split_posts"] >= 1
    assert server_metric(server, "toolfactory_calls_total", tool="sleep") - before == 2  # joined, not rerun


async def test_retry_of_a_finished_call_is_answered_from_the_store(server: str) -> None:
    key = new_call_id()
    call = Call(new_call_id(), "count", {"key": key})
    async with ToolClient(server) as client:
        (first,) = await client.call_tools([call])
        (again,) = await client.call_tools([call])
        (fresh,) = await client.call_tools([Call(new_call_id(), "count", {"key": key})])
    assert first.structured["count"] == 1
    assert again.structured["count"] == 1  # same call_id: not run again
    assert fresh.structured["count"] == 2


async def test_overloaded_server_answers_429_and_the_client_retries() -> None:
    config = server_config(limits={"max_concurrency": 2, "max_queue": 0, "retry_after_s": 0})
    with running_server(config) as proc:
        url = proc.url
        calls = [Call(new_call_id(), "sleep", {"seconds": 0.2}) for _ in range(6)]
        async with ToolClient(url, max_batch=1, backoff_s=0.02) as client:
            results = await asyncio.gather(*(client.call_tools([c]) for c in calls))
            metrics = client.metrics()
        assert not any(r[0].is_error for r in results), results
        assert metrics["errors"].get("http_429", 0) >= 1
        assert server_metric(url, "toolfactory_rejected_batches_total") >= 1
        assert server_metric(url, "toolfactory_calls_total", tool="sleep") == 6  # nothing ran twice


async def test_overload_that_outlasts_the_deadline_is_an_overloaded_result() -> None:
    config = server_config(limits={"max_concurrency": 1, "max_queue": 0, "retry_after_s": 0})
    with running_server(config) as proc:
        url = proc.url
        async with ToolClient(url, max_batch=1, backoff_s=0.02) as client:
            slow = asyncio.create_task(client.call("sleep", {"seconds": 1.5}))
            await asyncio.sleep(0.3)
            blocked = await client.call("echo", {"text": "x"}, timeout_s=0.5)
            assert not (await slow).is_error
    assert blocked.is_error and blocked.error.kind in (ErrorKind.OVERLOADED, ErrorKind.TIMEOUT)


async def test_a_saturated_server_is_not_hammered_and_every_call_completes() -> None:
    """Far more calls than a tiny server admits (2 running + 3 queued, Retry-After 1 s).

    The client holds its sends back after a 429 and then sends only what the server took
    before (a window learned from the rejection), so every call completes without error and
    each call is sent only a few times.
    """
    config = server_config(limits={"max_concurrency": 2, "max_queue": 3, "retry_after_s": 1})
    with running_server(config) as proc:
        url = proc.url
        calls = [Call(new_call_id(), "sleep", {"seconds": 0.05}) for _ in range(60)]
        async with ToolClient(url, timeout_s=40) as client:
            results = await asyncio.gather(*(client.call_tools([c]) for c in calls))
            metrics = client.metrics()
        assert not [r[0].error for r in results if r[0].is_error][:3]
        assert server_metric(url, "toolfactory_calls_total", tool="sleep") == 60  # nothing ran twice
        rejected = server_metric(url, "toolfactory_rejected_batches_total")
    assert metrics["errors"].get("http_429", 0) >= 1
    sent = sum(r["calls"] for r in metrics["replicas"])  # every attempt of every call
    assert sent <= 3 * len(calls), metrics  # at most 2 re-sends per call on average
    assert sent == metrics["calls_sent"]
    assert metrics["retries"] <= 2 * len(calls)
    assert rejected <= 20  # about one refused probe per Retry-After, not a refusal per call and backoff


async def test_sessions_stick_to_one_replica() -> None:
    with running_server() as proc_a, running_server() as proc_b:
        a, b = proc_a.url, proc_b.url
        async with ToolClient([a, b]) as client:
            implicit = [new_session_id() for _ in range(16)]  # created on first use
            explicit = [await client.create_session() for _ in range(4)]  # POST /v1/sessions
            sessions = implicit + explicit
            for _ in range(3):
                await asyncio.gather(*(client.call_tools([echo_call(i, s)]) for i, s in enumerate(sessions)))
            pinned = {s: client.session_replica(s) for s in sessions}
            metrics = client.metrics()
        assert set(pinned.values()) == {a, b}  # sessions are spread over both replicas
        for url in (a, b):  # every call of a session ran on the session's replica
            expected = 3 * sum(home == url for home in pinned.values())
            assert server_metric(url, "toolfactory_calls_total", tool="echo") == expected
        async with httpx.AsyncClient() as http:
            for session in explicit:
                home = pinned[session]
                other = b if home == a else a
                assert (await http.delete(f"{home}/v1/sessions/{session}")).status_code == 200
                assert (await http.delete(f"{other}/v1/sessions/{session}")).status_code == 404
        assert metrics["session_moves"] == 0


async def test_release_session_frees_server_state(server: str) -> None:
    async with ToolClient(server) as client:
        session = await client.create_session()
        await client.call_tools([echo_call(0, session)])
        await client.release_session(session)
        await client.release_session(session)  # already gone: not an error
        metrics = client.metrics()
    async with httpx.AsyncClient() as http:
        assert (await http.delete(f"{server}/v1/sessions/{session}")).status_code == 404
    assert "release_session" not in metrics["errors"]


async def test_dead_replica_is_routed_around(server: str) -> None:
    dead = free_port_url()
    async with ToolClient([dead, server], health_interval_s=0.2, backoff_s=0.01) as client:
        results = await asyncio.gather(*(client.call_tools([echo_call(i)]) for i in range(50)))
        metrics = client.metrics()
        health = await client.check_health()
    assert not any(r[0].is_error for r in results)
    assert health == {dead: False, server: True}
    replicas = {r["url"]: r for r in metrics["replicas"]}
    assert replicas[server]["calls"] >= 50


async def test_replica_that_dies_mid_run_is_routed_around() -> None:
    with running_server() as survivor_proc:
        survivor = survivor_proc.url
        stack = contextlib.ExitStack()
        victim = stack.enter_context(running_server()).url
        try:
            async with ToolClient([victim, survivor], backoff_s=0.01) as client:
                first = await asyncio.gather(*(client.call_tools([echo_call(i)]) for i in range(40)))
                stack.close()  # the victim server stops
                second = await asyncio.gather(*(client.call_tools([echo_call(i)]) for i in range(40)))
                metrics = client.metrics()
        finally:
            stack.close()
    assert not any(r[0].is_error for r in first + second)
    assert {r["url"]: r["healthy"] for r in metrics["replicas"]} == {victim: False, survivor: True}


async def test_a_call_waits_out_a_server_restart_and_the_replica_comes_back_up() -> None:
    port = int(free_port_url().rsplit(":", 1)[1])
    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        url = first.enter_context(running_server(extra_args=["--port", str(port)])).url
        async with ToolClient(url, health_interval_s=0.1, max_backoff_s=0.3, max_retries=60) as client:
            assert not (await client.call("echo", {"text": "before"})).is_error
            first.close()  # the server goes away ...
            waiting = asyncio.create_task(client.call("echo", {"text": "during"}))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            # ... and comes back on the same port; the call's retries (same call_id) get through.
            await asyncio.to_thread(second.enter_context, running_server(extra_args=["--port", str(port)]))
            result = await waiting
            await asyncio.sleep(0.3)  # a health probe has run since
            metrics = client.metrics()
    assert not result.is_error and result.structured["text"] == "during"
    assert metrics["errors"]["connect"] >= 1 and metrics["retries"] >= 1
    assert metrics["replica_down_events"] >= 1 and metrics["replica_up_events"] >= 1
    assert metrics["replicas"][0]["healthy"]


async def test_unreachable_server_gives_unavailable_results_after_retries() -> None:
    async with ToolClient(free_port_url(), max_retries=2, backoff_s=0.01, health_interval_s=0) as client:
        (result,) = await client.call_tools([echo_call(0)])
        metrics = client.metrics()
    assert result.is_error and result.error.kind == ErrorKind.UNAVAILABLE
    assert "gave up after 3 tries" in result.error.message
    assert metrics["errors"]["connect"] == 3


async def test_token_is_sent_and_a_wrong_one_is_refused() -> None:
    with running_server(env={"TOOLFACTORY_TOKENS": "sesame-open-up-please"}) as proc:
        url = proc.url
        async with ToolClient(url, token="sesame-open-up-please") as client:
            ok = await client.call("echo", {"text": "hi"})
        async with ToolClient(url, token="wrong") as client:
            refused = await client.call("echo", {"text": "hi"})
    assert not ok.is_error
    assert refused.is_error and refused.error.kind == ErrorKind.UNAUTHORIZED


async def test_verify_requests_are_batched() -> None:
    requests = [
        VerifyRequest("exact_match", ground_truth="Paris", response=f"<answer>{a}</answer>")
        for a in ("Paris", "paris.", "London")
    ]
    config = server_config(verifiers=[{"target": "tools.verifiers.match:exact_match"}])
    with running_server(config) as proc:
        async with ToolClient(proc.url, batch_window_ms=20) as client:
            results = await asyncio.gather(*(client.verify([r]) for r in requests))
            metrics = client.metrics()
    assert [r[0].score for r in results] == [1.0, 1.0, 0.0]
    assert metrics["verify_requests"] == 3 and metrics["verify_batches"] == 1


async def test_list_tools_by_toolset(server: str) -> None:
    async with ToolClient(server) as client:
        names = {t["name"] for t in await client.list_tools("test")}
    assert {"echo", "sleep"} <= names


async def test_closing_the_client_settles_waiting_calls(server: str) -> None:
    client = ToolClient(server)
    task = asyncio.create_task(client.call("sleep", {"seconds": 5}))
    await asyncio.sleep(0.2)
    await client.aclose()
    result = await task
    assert result.is_error and result.error.kind == ErrorKind.CANCELLED


def test_idempotency_comes_from_our_meta_first_then_the_mcp_hints() -> None:
    ours = {"_meta": {"toolfactory": {"idempotent": False}}, "annotations": {"readOnlyHint": True}}
    assert not _declares_idempotent(ours)  # our readOnlyHint only means "no session state"
    assert _declares_idempotent({"_meta": {"toolfactory": {"idempotent": True}}})
    assert _declares_idempotent({"annotations": {"idempotentHint": True}})  # a third party's tool
    assert _declares_idempotent({"annotations": {"readOnlyHint": True}})
    assert not _declares_idempotent({"annotations": {"destructiveHint": False}})
    assert not _declares_idempotent({"name": "x"})  # says nothing: not idempotent


def test_bad_urls_are_rejected_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="http://"):
        ToolClient("localhost:8000")
    with pytest.raises(ValueError, match="at least one"):
        ToolClient([])


async def test_mcp_mode_lists_and_calls_tools(server: str) -> None:
    async with McpToolClient(f"{server}/mcp/test", mode="2026-07-28") as client:
        names = {t["name"] for t in await client.list_tools()}
        session = new_session_id()
        results = await client.call_tools(
            [echo_call(1, session), Call(new_call_id(), "sleep", {"seconds": -1})]
        )
        await client.release_session(session)
    assert {"echo", "sleep"} <= names
    assert results[0].structured["text"] == "t1" and not results[0].is_error
    assert results[1].is_error and results[1].error.kind == ErrorKind.INVALID_ARGUMENTS


async def test_mcp_legacy_mode_calls_the_default_toolset(server: str) -> None:
    async with McpToolClient(f"{server}/mcp", mode="legacy") as client:
        (result,) = await client.call_tools([Call(new_call_id(), "calculator", {"expression": "2**10"})])
    assert not result.is_error and "1024" in result.text


async def test_mcp_mode_unreachable_server_gives_unavailable_results() -> None:
    url = f"{free_port_url()}/mcp"
    for mode in ("2026-07-28", "legacy"):  # the first connects lazily, the second at once
        client = McpToolClient(url, mode=mode)
        (result,) = await client.call_tools([echo_call(0)])
        await client.aclose()
        assert result.is_error and result.error.kind == ErrorKind.UNAVAILABLE, result
        assert url in result.error.message


def test_sync_wrapper(server: str) -> None:
    with SyncToolClient(server) as tools:
        result = tools.call("calculator", {"expression": "2+2"})
        names = {t["name"] for t in tools.list_tools()}
        metrics = tools.metrics()
    assert result.text.strip() == "4"
    assert "calculator" in names
    assert metrics["calls"] == 1
    with pytest.raises(RuntimeError, match="closed"):
        tools.call("calculator", {"expression": "1"})
