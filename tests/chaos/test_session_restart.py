"""A replica that restarts at the same address never hands a session an empty state.

Real tool-server processes on loopback: one is killed (SIGKILL) and a new process is
started on the same port, as a restarted container or a pod that kept its IP would be.
A session opened on the old process gets ``unknown_session`` from then on, never a fresh
interpreter or notebook; new sessions and stateless calls go on. Released and expired
session ids get the same error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from protocol import Call, ErrorKind, Result, new_call_id, new_session_id
from tests.support.gate_tools import started
from tests.support.require import require
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config
from trainer_client.client.tool_client import ToolClient

pytestmark = pytest.mark.timeout(180)

NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}
PYTHON = {"target": "tools.python_tool:PythonTool", "toolsets": ["test"], "args": {"pool_size": 1}}
CONFIG = server_config(tools=[*BASE_TOOLS, NOTEBOOK])
INSTANCE = "x-toolfactory-instance"
TURNS = 4  # notebook calls per trajectory in the rollout test
HOLD_AT = 3  # the rollout's trajectories wait before their third turn while a replica restarts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Restartable:
    """A replica on a fixed port that can be killed and started again there."""

    def __init__(self, stack: contextlib.ExitStack, config: dict[str, Any]) -> None:
        self._stack, self._config = stack, config
        self._args = ["--port", str(free_port())]
        self.process = self._start()

    def _start(self) -> ServerProcess:
        return self._stack.enter_context(running_server(self._config, extra_args=self._args))

    @property
    def url(self) -> str:
        return self.process.url

    def restart(self) -> None:
        """SIGKILL (no drain, nothing saved), then a new process on the same address."""
        old = self.process
        old.proc.kill()
        old.proc.wait(10)
        self.process = self._start()
        assert self.process.url == old.url


@pytest.fixture
def replica() -> Iterator[Restartable]:
    with contextlib.ExitStack() as stack:
        yield Restartable(stack, server_config(tools=[*BASE_TOOLS, NOTEBOOK, PYTHON]))


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def sessions_open(url: str) -> float:
    """The replica's own count of open sessions (its /metrics gauge)."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("toolfactory_sessions "):
            return float(line.split()[1])
    raise AssertionError("no toolfactory_sessions gauge in /metrics")


def python(session: str, code: str) -> Call:
    return Call(new_call_id(), "python", {"code": code}, session)


def lost(result: Result) -> bool:
    return result.is_error and result.error is not None and result.error.kind == ErrorKind.UNKNOWN_SESSION


# --------------------------------------------------------------------------- one client, one replica


@pytest.mark.parametrize("probing", [False, True], ids=["first-contact-is-the-call", "probe-sees-it-first"])
async def test_a_restarted_replica_refuses_old_sessions_instead_of_starting_them_empty(
    replica: Restartable, probing: bool
) -> None:
    """x = 1 in a python session; the replica restarts; ``print(x)`` of that session is
    ``unknown_session`` (never a NameError from a fresh interpreter), now and later; a new
    session and a stateless call in the same batch run on the new process.

    Without probes the client's first contact with the new process is that batch, and the
    server refuses it (the batch names the old process). With probes, a probe sees the new
    process first and the client fails the session without sending it: the new process
    never holds a session of that id."""
    health = {"health_interval_s": 0.2} if probing else {"health_interval_s": 0}
    async with ToolClient(replica.url, timeout_s=60, **health) as client:
        old, fresh = f"old-{new_session_id()}", f"new-{new_session_id()}"
        (first,) = await client.call_tools([python(old, "x = 1")])
        assert not first.is_error, first.error
        (kept,) = await client.call_tools([python(old, "print(x)")])
        assert kept.text.strip() == "1", kept

        await asyncio.to_thread(replica.restart)
        if probing:
            await until(lambda: client.metrics()["sessions_lost"] >= 1, "a probe noticed the new process")
        after = await client.call_tools(
            [
                python(old, "print(x)"),
                python(fresh, "y = 2; print(y)"),
                Call(new_call_id(), "echo", {"text": "hi"}),
            ]
        )
        again = await client.call_tools([python(old, "print('still here?')")])

    gone, new_session, stateless = after
    assert lost(gone), gone
    assert "NameError" not in gone.text
    if probing:
        assert "restarted (instance" in gone.error.message and replica.url in gone.error.message
        assert "new session" in gone.error.message
    else:  # the new process refused it: the batch named the process the session lived in
        assert "is not on this replica" in gone.error.message and "its state is lost" in gone.error.message
    assert lost(again[0]) and "restarted" in again[0].error.message  # and it stays lost
    assert not new_session.is_error and new_session.text.strip() == "2", new_session
    assert not stateless.is_error and stateless.structured["text"] == "hi"
    assert sessions_open(replica.url) == 1  # only the new session: the old id was never opened there


async def test_released_and_expired_session_ids_are_refused_not_restarted(tmp_path: Path) -> None:
    """A released id and one the TTL sweeper closed both get ``unknown_session`` when a
    late call comes, not an empty notebook; a session with a call in flight all along is kept.

    No timing: the busy session's first call waits at a gate the test opens only after the
    idle one was swept, so it is in flight however slow the machine; the TTL (5 s) only has
    to outlast the moment between that call's end and the next call of the same batch."""
    held = {"target": "tests.support.gate_tools:held_notebook", "toolsets": ["test"]}
    config = server_config(
        tools=[*BASE_TOOLS, NOTEBOOK, held], sessions={"ttl_s": 5.0, "sweep_interval_s": 0.2}
    )
    gate = str(tmp_path / "gate")
    with running_server(config) as server:
        # Two clients: one POST answers all its calls together, so the held call goes alone.
        async with (
            ToolClient(server.url, timeout_s=120, health_interval_s=0) as holder,
            ToolClient(server.url, timeout_s=120, health_interval_s=0) as client,
        ):
            released, idle, busy = (f"{name}-{new_session_id()}" for name in ("released", "idle", "busy"))
            held_call = Call(new_call_id(), "held_notebook", {"gate": gate, "put": "a"}, busy)
            in_flight = asyncio.create_task(holder.call_tools([held_call]))
            for result in await client.call_tools([notebook(s, "a") for s in (released, idle)]):
                assert result.structured and result.structured["lines"] == ["a"], result
            while started(gate) < 1:
                await asyncio.sleep(0.05)
            await client.release_session(released)
            while sessions_open(server.url) > 1:  # the sweeper closes the idle one; busy is in use
                await asyncio.sleep(0.2)
            late_calls = [notebook(released, "b"), notebook(idle, "b"), notebook(busy, "b")]
            late = asyncio.create_task(client.call_tools(late_calls))
            Path(gate).touch()
            (first,) = await in_flight
            late_results = await late
    assert first.structured["lines"] == ["a"], first
    assert [lost(r) for r in late_results] == [True, True, False], late_results
    for result in late_results[:2]:
        assert "released or expired" in result.error.message
    assert late_results[2].structured["lines"] == ["a", "b"]


def notebook(session: str, put: str) -> Call:
    return Call(new_call_id(), "notebook", {"put": put}, session)


# --------------------------------------------------------------------------- the wire contract


async def test_the_instance_fence_over_http_and_mcp(replica: Restartable) -> None:
    """What the server does with the instance header and ``_meta``, raw: every answer names
    the process; a request naming another one gets ``unknown_session`` for the sessions the
    process does not hold (calls and verify requests alike), while stateless calls and the
    sessions it does hold run; a client that names no instance (an older one, curl) is
    served as before."""
    url = replica.url
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        health = await http.get("/healthz")
        me = health.headers[INSTANCE]
        assert len(me) >= 16 and (await http.get("/readyz")).headers[INSTANCE] == me

        held, stranger = f"held-{uuid.uuid4().hex}", f"stranger-{uuid.uuid4().hex}"

        async def calls(header: str | None, *items: tuple[str, str | None]) -> list[dict[str, Any]]:
            body = {
                "calls": [
                    {
                        "call_id": new_call_id(),
                        "name": name,
                        "arguments": {"put": "p"} if session else {"text": "t"},
                    }
                    | ({"session": session} if session else {})
                    for name, session in items
                ]
            }
            response = await http.post("/v1/calls", json=body, headers={INSTANCE: header} if header else {})
            assert response.status_code == 200 and response.headers[INSTANCE] == me
            return response.json()["results"]

        opened = await calls(None, ("notebook", held))  # no header: created on first use, as before
        assert opened[0]["structured"]["lines"] == ["p"]
        mixed = await calls("0123456789abcdef", ("notebook", held), ("notebook", stranger), ("echo", None))
        assert mixed[0]["structured"]["lines"] == ["p", "p"]  # held here: it goes on
        assert mixed[1]["error"]["kind"] == "unknown_session"
        assert (
            "instance 0123456789abcdef" in mixed[1]["error"]["message"] and me in mixed[1]["error"]["message"]
        )
        assert mixed[2]["structured"]["text"] == "t"
        assert (await calls(me, ("notebook", stranger)))[0]["structured"]["lines"] == [
            "p"
        ]  # named right: opens

        verify = await http.post(
            "/v1/verify",
            json={
                "requests": [
                    {"verifier": "exact_match", "response": "a", "ground_truth": "a", "session": "v-x"}
                ]
            },
            headers={INSTANCE: "0123456789abcdef"},
        )
        assert verify.status_code == 200 and verify.headers[INSTANCE] == me
        assert verify.json()["results"][0]["error"]["kind"] == "unknown_session"

    async with Client(url + "/mcp/test", mode="2026-07-28") as mcp:
        session = f"mcp-{uuid.uuid4().hex}"
        first = await mcp.call_tool("notebook", {"put": "m"}, meta={"toolfactory/session": session})
        assert not first.is_error and first.meta["toolfactory"]["instance"] == me
        refused = await mcp.call_tool(
            "notebook",
            {"put": "m"},
            meta={
                "toolfactory/session": f"mcp-{uuid.uuid4().hex}",
                "toolfactory/instance": "0123456789abcdef",
            },
        )
        assert refused.is_error and refused.meta["toolfactory"]["error_kind"] == "unknown_session"
        await asyncio.to_thread(replica.restart)
    async with Client(url + "/mcp/test", mode="2026-07-28") as mcp:  # a client that sends back what it saw
        after = await mcp.call_tool(
            "notebook", {"put": "m"}, meta={"toolfactory/session": session, "toolfactory/instance": me}
        )
    assert after.is_error and after.meta["toolfactory"]["error_kind"] == "unknown_session"
    assert after.meta["toolfactory"]["instance"] != me


async def test_the_mcp_invoker_names_the_process_and_sees_a_restart(replica: Restartable) -> None:
    """``McpToolClient`` (a rollout over plain MCP) sends back the process a session was
    opened on: after a restart that session is ``unknown_session``, not an empty notebook,
    while a new session opens on the new process. Without the echo the old id would open
    afresh there (the last assertion shows what an unfenced call gets)."""
    from trainer_client.client.mcp import McpToolClient

    session, fresh = f"mcp-{uuid.uuid4().hex}", f"mcp-{uuid.uuid4().hex}"
    async with McpToolClient(replica.url + "/mcp/test", mode="2026-07-28") as client:
        (first,) = await client.call_tools([notebook(session, "a")])
        assert first.structured["lines"] == ["a"], first
        await asyncio.to_thread(replica.restart)
        gone, new = await client.call_tools([notebook(session, "b"), notebook(fresh, "c")])
    assert lost(gone) and "is not on this replica" in gone.text, gone
    assert not new.is_error and new.structured["lines"] == ["c"], new
    async with McpToolClient(replica.url + "/mcp/test", mode="2026-07-28") as unfenced:
        (reopened,) = await unfenced.call_tools([notebook(session, "b")])
    assert reopened.structured["lines"] == ["b"]  # a client that never saw the instance: created on first use


# --------------------------------------------------------------------------- a rollout


class Gated:
    """The scripted model, holding every trajectory before its turn ``HOLD_AT`` until opened,
    so that a replica restarts while no call of those trajectories is out."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.turns: Counter[str] = Counter()
        self.held = 0
        self.opened = asyncio.Event()

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        self.turns[request_id] += 1
        if self.turns[request_id] == HOLD_AT and not self.opened.is_set():
            self.held += 1
            await self.opened.wait()
        return await self.inner.generate(request_id, **kwargs)


@pytest.fixture(scope="module")
def smol_tokenizer() -> Any:
    require("transformers", "the rollout test renders turns with the SmolLM2 tokenizer (trainer extra)")
    from trainer_client.backends.models import load_tokenizer

    return load_tokenizer("smollm2")


def lines_of(text: str) -> list[str] | None:
    """The notebook lines an observation shows (None: an error, not a notebook)."""
    try:
        return list(json.loads(text)["lines"])
    except (ValueError, KeyError, TypeError):
        return None


async def test_a_replica_restarted_mid_rollout_ends_only_its_sessions(smol_tokenizer: Any) -> None:
    """Two replicas; every trajectory has made two notebook calls when one replica is killed
    and started again on its port. The trajectories whose session lived there end at their
    next call with ``StopReason.SESSION_LOST`` and the clear ``unknown_session`` message,
    unscored, and never see a fresh notebook; all the
    others keep their whole notebook and end with an answer; trajectories started after the
    restart use the new process as well."""
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task

    eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")

    def turn(text: str) -> ScriptedTurn:
        return ScriptedTurn(
            [*smol_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids, eos]
        )

    def call(k: int) -> str:
        return f'<tool_call>{{"name": "notebook", "arguments": {{"put": "t{k}"}}}}</tool_call>'

    script = [turn(call(k)) for k in range(1, TURNS + 1)] + [turn("<answer>done</answer>")]
    model = Gated(ScriptedGenerator(script, tokenizer=smol_tokenizer, eos_token_ids=[eos]))
    config = RolloutConfig(format="hermes", max_turns=TURNS + 1)
    first = [f"first-{i}-{new_session_id()}" for i in range(16)]
    second = [f"second-{i}-{new_session_id()}" for i in range(16)]

    with contextlib.ExitStack() as stack:
        victim, survivor = Restartable(stack, CONFIG), Restartable(stack, CONFIG)
        # No health probes: the client's first contact with the new process is a session's call.
        async with ToolClient([victim.url, survivor.url], timeout_s=60, health_interval_s=0) as client:
            core = RolloutCore(smol_tokenizer, model, client, config)

            def roll(session: str) -> asyncio.Task[Any]:
                task = Task([{"role": "user", "content": f"keep notes ({session})"}])
                return asyncio.create_task(core.run(task, session_id=session))

            wave = [roll(s) for s in first]
            await until(lambda: model.held == len(first), "every trajectory at its third turn")
            homes = {s: client.session_replica(s) for s in first}
            on_victim = {s for s, url in homes.items() if url == victim.url}
            assert on_victim and len(on_victim) < len(first), homes

            await asyncio.to_thread(victim.restart)
            model.opened.set()
            late = [roll(s) for s in second]
            await until(lambda: all(client.session_replica(s) for s in second), "the late sessions' homes")
            late_homes = {client.session_replica(s) for s in second}
            trajectories = await asyncio.wait_for(asyncio.gather(*wave, *late), 120)
            metrics = client.metrics()

    assert metrics["sessions_lost"] == len(on_victim)
    assert victim.url in late_homes  # the restarted replica serves new sessions
    refused_there = 0
    for session, trajectory in zip(first + second, trajectories, strict=True):
        observations = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
        notebooks = [lines_of(text) for text in observations]
        if session in on_victim:  # two good turns, then the trajectory ends unscored: never a fresh notebook
            assert notebooks == [["t1"], ["t1", "t2"]], observations
            assert (trajectory.stop_reason, trajectory.reward_score) == (StopReason.SESSION_LOST, None)
            assert trajectory.calls[-1]["error"] == "unknown_session", trajectory.calls
            # The first batch after the restart named the old process, and the new one refused
            # it; a call that went out after that answer was failed by the client itself.
            refused = "is not on this replica" in trajectory.error
            assert refused or "restarted (instance" in trajectory.error, trajectory.error
            refused_there += refused
        else:
            assert trajectory.stop_reason == StopReason.ANSWER, (trajectory.stop_reason, observations)
            assert notebooks == [[f"t{k}" for k in range(1, j + 1)] for j in range(1, TURNS + 1)]
    assert refused_there >= 1  # the new process's own fence answered at least once
