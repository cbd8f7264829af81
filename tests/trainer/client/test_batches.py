"""How ``ToolClient`` forms, sends and splits batches, against real servers on loopback: a call
that cannot be sent fails alone, and batches are split only when one of their calls is to blame."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator

import pytest

from protocol import Call, ErrorKind, VerifyRequest, new_call_id
from tests.support.server import running_server, server_config
from trainer_client.client.tool_client import ToolClient


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server() as proc:
        yield proc.url


def echo(text: object) -> Call:
    return Call(new_call_id(), "echo", {"text": text})


async def test_a_call_whose_arguments_cannot_be_serialised_fails_alone(server: str) -> None:
    """It used to fail every call of its POST with ``unavailable`` ("client error sending a
    batch"): the rollout core checks arguments before, but ``call_tools`` is public."""
    too_big, not_json = echo(2**70), echo(object())
    async with ToolClient(server, split_after_ms=0) as client:
        given = await client.call_tools([echo("a"), too_big, echo("b"), not_json])
        # Calls of other callers that share the POST are not dragged down either.
        shared = await asyncio.gather(*(client.call_tools([c]) for c in (echo("c"), echo(2**70), echo("d"))))
        metrics = client.metrics()
    assert [r.is_error for r in given] == [False, True, False, True], given
    assert [r[0].is_error for r in shared] == [False, True, False], shared
    assert [r.structured["text"] for r in (given[0], given[2])] == ["a", "b"]
    assert [r[0].structured["text"] for r in (shared[0], shared[2])] == ["c", "d"]
    for result, call in ((given[1], too_big), (given[3], not_json), (shared[1][0], None)):
        assert result.is_error and result.error is not None
        assert result.error.kind == ErrorKind.INVALID_ARGUMENTS
        assert "cannot be written as JSON" in result.error.message
        assert "send only JSON values" in result.error.message  # what to do
        if call is not None:
            assert result.call_id == call.call_id and call.call_id in result.error.message
    assert metrics["errors"] == {"unserialisable": 3}
    assert metrics["batches"] == 2  # each group went out as one POST, less the calls that could not


async def test_a_verify_request_that_cannot_be_serialised_fails_alone() -> None:
    def request(truth: object) -> VerifyRequest:
        return VerifyRequest("exact_match", ground_truth=truth, response="<answer>Paris</answer>")

    config = server_config(verifiers=[{"target": "tools.verifiers.match:exact_match"}])
    with running_server(config) as proc:
        async with ToolClient(proc.url) as client:
            results = await client.verify([request("Paris"), request({1, 2}), request("Rome")])
    assert [r.is_error for r in results] == [False, True, False], results
    assert [r.score for r in (results[0], results[2])] == [1.0, 0.0]
    assert results[1].error is not None and results[1].error.kind == ErrorKind.BAD_REQUEST
    assert "cannot be written as JSON" in results[1].error.message


async def test_a_client_whose_event_loop_runs_late_does_not_split_its_answered_batches(server: str) -> None:
    """A client whose own CPU is the limit finds its batches "late" only because it has not read
    their answers yet: splitting them adds a POST per call (hundreds per run at max_batch=64)."""
    async with ToolClient(server, split_after_ms=100, health_interval_s=0) as client:
        for i in range(10):  # quick batches: the replica's history says a split would help
            await client.call_tools([echo(i), echo(i)])
        batch = asyncio.create_task(client.call_tools([echo("x"), echo("y")]))
        while client.metrics()["batches"] == 10:  # until the batch is on its way
            await asyncio.sleep(0)
        time.sleep(0.6)  # the event loop is held (as by a busy trainer): the answer arrives meanwhile
        results = await batch
        metrics = client.metrics()
    assert [r.structured["text"] for r in results] == ["x", "y"]
    assert metrics["split_posts"] == 0, metrics


@pytest.fixture(scope="module")
def one_slot_server() -> Iterator[str]:
    with running_server(server_config(limits={"max_concurrency": 1})) as proc:
        yield proc.url


async def test_a_replica_working_through_its_queue_gets_no_split_posts(one_slot_server: str) -> None:
    """Its history is quick, so a late batch could be one held back by a slow call; but other
    batches are out and none sent after it has come back: the replica is queueing, and split
    POSTs would only queue behind the same calls."""
    async with ToolClient(one_slot_server, split_after_ms=150, max_batch=2, health_interval_s=0) as client:
        for i in range(10):
            await client.call_tools([echo(i), echo(i)])
        calls = [Call(new_call_id(), "sleep", {"seconds": 0.3}) for _ in range(8)]
        results = await asyncio.gather(*(client.call_tools([c]) for c in calls))  # 4 POSTs of 2
        metrics = client.metrics()
    assert not any(r[0].is_error for r in results), results
    assert metrics["batches"] == 14
    assert metrics["split_posts"] == 0, metrics


def test_call_ids_are_unique_and_a_forked_child_draws_its_own() -> None:
    """Ids are drawn from the OS a thousand at a time (cheaper than a uuid4 each): a child made
    by fork must not hand out the ids its parent drew and has yet to use, or two processes would
    send the same idempotency keys."""
    ids = [new_call_id() for _ in range(5_000)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report a few ids, then leave without running pytest's teardown
        os.write(write, " ".join(new_call_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    parent = [new_call_id() for _ in range(3)]
    assert len(set(ids + child + parent)) == len(ids) + 6, (child, parent)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids + child)  # 128 bits, as a uuid4's hex


async def test_a_proxy_set_in_the_environment_still_carries_the_batches(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx honours HTTP_PROXY; the client's own connection pool does not speak to proxies, so
    a client whose replica is behind one keeps sending through httpx. (Here the proxy is a dead
    address: a batch sent past it would succeed, one sent through it cannot connect.)"""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", free_port_url())
    async with ToolClient(server, timeout_s=3, health_interval_s=0) as client:
        result = await client.call("echo", {"text": "hi"})
    assert result.is_error and result.error is not None
    assert result.error.kind == ErrorKind.UNAVAILABLE and "connect" in result.error.message


def free_port_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"
